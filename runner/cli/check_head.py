"""`check-head`: what a draft head is, as `eagle:` or `medusa:` would load it, before any sweep: its layout, the target
layers it reads, its vocabulary map and its flags; or the one line that refuses it (exit code 2)."""

from __future__ import annotations

from typing import Annotated

import typer

from runner.cli.shared import Target, TrustRemoteCode, app, fail, stdout
from runner.engine.weights import head_files, medusa_files, models
from runner.engine.weights.head_files import EMBEDDING, HeadFile
from runner.engine.weights.medusa_files import MedusaFile


@app.command("check-head")
def check_head_command(
    head: Annotated[str, typer.Argument(help="a head directory, or a repo id in the local Hugging Face cache")],
    target: Target = models.DEFAULT_MODEL,
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Check a draft head against a target without loading either model; exit 0 if `eagle:<head>` (or, for Medusa
    heads, `medusa:<head>`) can load it."""
    try:
        config = models.load_config(target, trust_remote_code)
        if medusa_files.published_as_medusa(head):
            lines = describe_medusa(medusa_files.check(head, config), config.hidden_size)
        else:
            lines = describe(head_files.check(head, config), config.num_hidden_layers)
    except ValueError as exc:  # HeadError and ModelError: one line each
        fail(str(exc))
    for line in lines:
        stdout.print(line, markup=False, highlight=False, soft_wrap=True)


def describe(checked: HeadFile, target_layers: int) -> list[str]:
    c, shapes = checked.config, checked.weights.shapes
    embedding = f"its own ({shapes[EMBEDDING][0]} x {shapes[EMBEDDING][1]})" if EMBEDDING in shapes else "the target's"
    layers = "the midlayer" + (f" and {c.num_layers - 1} plain decoder layers (layers.1.*, …)" if c.num_layers > 1
                               else "")
    return [
        f"head: {checked.path}",
        f"weights: {checked.weights.described}, {len(shapes)} tensors, every one read",
        f"layout: EAGLE-3, {layers}; width {c.hidden_size}, reading target features of width "
        f"{c.target_hidden_size}; embedding: {embedding}",
        f"target layers: {_layers(checked, target_layers)}",
        f"vocabulary: {c.draft_vocab_size} draft tokens of the target's {c.vocab_size}; t2d {checked.t2d}",
        "flags: " + ", ".join(f"{key}={value}" for key, value in c.flags().items()),
        "refused: nothing; loads as eagle:" + str(checked.path),
    ]


def describe_medusa(checked: MedusaFile, hidden: int) -> list[str]:
    own = [i for i, has in enumerate(checked.own_lm_heads) if has]
    if len(own) == checked.heads:
        lm = "each head its own"
    elif not own:
        lm = "the target's, shared by every head"
    else:
        lm = f"their own for heads {own}, the target's for the others"
    return [
        f"head: {checked.path}",
        f"weights: {checked.weights.described}, {len(checked.weights.shapes)} tensors, every one read",
        f"layout: Medusa-1, {checked.heads} heads of {checked.layers} residual blocks each, over the target's last "
        f"hidden state after its final norm (width {hidden}); head i's likeliest token is draft i + 1",
        f"LM heads: {lm}",
        f"refused: nothing; loads as medusa:{checked.path} and medusa-tree:{checked.path}",
    ]


def _layers(checked: HeadFile, target_layers: int) -> str:
    c = checked.config
    read = f"hidden states {list(checked.layers)} of a {target_layers}-layer target"
    if target_layers in checked.layers:
        read += f" ({target_layers}: the last layer's output, before the final norm)"
    if c.aux_layer_ids is None:
        return f"{read}: EAGLE-3's default, the inputs of layers 2, L/2 and L-3 (no layer ids in config.json)"
    convention = "outputs of layers (first id 1: SGLang's and SpecForge's convention), each + 1" if c.id_shift \
        else "inputs of layers (first id not 1: vLLM's convention), as they are"
    return f"{read}, from {c.aux_key} {list(c.aux_layer_ids)}: {convention}"
