"""The seeds `runner write-prompts` starts from: topics, and for each kind of task the request the target answers
with the material of a prompt. Written for specdash; every prompt is then the target's own text."""

from __future__ import annotations

TOPICS = (
    "bees", "volcanoes", "the moon", "bread baking", "bicycles", "rainforests", "the printing press", "chess",
    "electric cars", "coral reefs", "the Roman Empire", "recycling", "sleep", "coffee", "trains", "glaciers",
    "the human heart", "solar panels", "photosynthesis", "the stock market", "ancient Egypt", "jazz music",
    "football", "vaccines", "deserts", "the internet", "whales", "gardening", "earthquakes", "the water cycle",
    "libraries", "bridges", "honey", "mountains", "the immune system", "dinosaurs", "space telescopes", "tea",
    "public transport", "birds that migrate", "the ocean tides", "cheese making", "wind turbines", "castles",
    "the brain", "rivers", "cooking rice", "mushrooms", "airplanes", "the weather", "batteries", "the Olympics",
    "penguins", "paper money", "clocks", "forests in winter", "the alphabet", "maps", "robots", "museums",
    "a small bakery", "a school library", "a city park", "a train timetable", "a shopping list", "a birthday party",
    "a football club", "a weather station", "a bank account", "a bus route", "a recipe book", "a music playlist",
)

# kind -> (category, the request to the target, how many new tokens its answer may take)
REQUESTS = {
    "question": ("question", "Write one question a curious student might ask about {topic}. "
                             "Reply with the question only.", 40),
    "instruction": ("instruction", "Write one short instruction asking an assistant to do a useful task about "
                                   "{topic}. Reply with the instruction only.", 48),
    "summary": ("summary", "Write a short paragraph of four or five sentences about {topic}.", 140),
    "code": ("code", "Write a short Python function about {topic}. Reply with the code only.", 120),
    "translation": ("translation", "Write two short, simple sentences about {topic}.", 48),
    "math": ("math", "Write a short maths word problem about {topic} that uses numbers. "
                     "Reply with the problem only.", 72),
    "multi-turn": ("multi-turn", "Write one question a curious student might ask about {topic}. "
                                 "Reply with the question only.", 40),
}

# How a passage, a function or a text the target wrote becomes the prompt; one picked at random each time.
SUMMARISE = ("Summarize the following text in two sentences:\n\n{text}",
             "Give a one-sentence summary of this passage:\n\n{text}",
             "Write a short summary of the text below for a busy reader.\n\n{text}",
             "What are the main points of this paragraph? Answer in a few bullet points.\n\n{text}")
FIX = ("This Python function has a bug. Find it and fix it:\n\n```python\n{text}\n```",
       "Fix the bug in this code and explain the fix in one sentence:\n\n```python\n{text}\n```",
       "The function below gives wrong results. Correct it:\n\n```python\n{text}\n```")
TRANSLATE = ("Translate into French:\n\n{text}", "Translate into Spanish:\n\n{text}",
             "Translate into German:\n\n{text}", "Translate this text into Italian:\n\n{text}")
FOLLOW_UPS = ("Can you explain that more simply?", "Give me an example.", "Why is that?",
              "Can you say that in two sentences?", "What is a common mistake people make about this?",
              "How would you explain it to a child?", "Tell me one more interesting fact about it.")
# The bugs put into a function the target wrote: the first of these found in it is swapped.
BUGS = ((" + ", " - "), (" - ", " + "), (" < ", " <= "), (" > ", " >= "), (" == ", " != "), (" * ", " / "),
        ("return ", "return not "), ("range(", "range(1, "))
