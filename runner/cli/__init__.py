"""`python -m runner …`: the command line only parses into configs and calls one function.

One module per group of commands: `decoding` (generate, sweep), `data` (merge, sql, list, serve), `training`
(write-prompts, train-draft), `check_head` (check-head) and `reports` (report spec-bench); `common` holds the app,
the shared options and the one-line errors. The commands are registered here, in the order `--help` lists them.
"""

from runner.cli.check_head import check_head_command
from runner.cli.common import app, main
from runner.cli.data import list_command, merge, serve_command, sql_command
from runner.cli.decoding import generate, sweep
from runner.cli.reports import report_app
from runner.cli.training import train_draft_command, write_prompts_command

app.command()(generate)
app.command()(sweep)
app.command()(merge)
app.command("sql")(sql_command)
app.command("list")(list_command)
app.command("write-prompts")(write_prompts_command)
app.command("train-draft")(train_draft_command)
app.command("check-head")(check_head_command)
app.command("serve")(serve_command)
app.add_typer(report_app, name="report")

__all__ = ["app", "main"]
