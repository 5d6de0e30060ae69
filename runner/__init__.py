"""specdash runner: real draft/target pairs, one recorded row per verification round."""

import os

# No model hub is assumed: repo ids resolve from the local Hugging Face cache unless the user set
# HF_HUB_OFFLINE=0. It must be set before huggingface_hub is imported, hence here.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
