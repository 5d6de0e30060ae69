"""One tree round laid out for drawing: every node at its depth, with its fate and the target's token; pure.

The root (depth 0) is the newest committed token; a node's depth is its level, 1 for the root's children. Leaves
take lanes 0, 1, 2, … in depth-first order (children in node order) and a parent sits at the mean lane of its
children, so no two branches cross.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from dashboard.fates import ROOT, Decode, node_fates, target_after, tree_parents

COLUMNS = ["node", "parent", "depth", "lane", "parent_depth", "parent_lane", "token", "text", "fate", "stop",
           "wanted_token", "wanted_text", "target_token", "target_text"]


def _lanes(children: dict[int, list[int]]) -> dict[int, float]:
    lanes: dict[int, float] = {}
    leaves = 0

    def place(node: int) -> None:
        nonlocal leaves
        if not children[node]:
            lanes[node], leaves = float(leaves), leaves + 1
            return
        for child in children[node]:
            place(child)
        lanes[node] = sum(lanes[child] for child in children[node]) / len(children[node])

    place(ROOT)
    return lanes


def _shown(decode: Decode, token: int | None) -> str | None:
    return None if token is None else decode(token).replace("\n", "⏎")


def layout(row: Mapping, decode: Decode, root_token: int | None = None) -> pd.DataFrame:
    """A tree round (a `rounds` row with `draft_parents`) as one row per node, the root first (node ROOT): its
    depth and lane, its parent's, its token and text ("root" where the root's token is not given), its fate (root,
    accepted, rejected, thrown), whether the accepted path stopped there, and the target's own token in its place
    (after its parent) and after it, where the round recorded them."""
    parents = tree_parents(row)
    if parents is None:
        raise ValueError("a chain round has no tree to lay out")
    path = [int(node) for node in row["accepted_path"]]
    tokens = [root_token, *(int(t) for t in row["draft_tokens"])]
    children: dict[int, list[int]] = {ROOT: [], **{node: [] for node in range(len(parents))}}
    depth = {ROOT: 0}
    for node, parent in enumerate(parents):  # parents precede their children
        children[parent].append(node)
        depth[node] = depth[parent] + 1
    lanes, after = _lanes(children), target_after(row)
    fates = ["root", *node_fates(parents, path)]
    stop = path[-1] if path else ROOT
    records = []
    for node, parent, token, fate in zip([ROOT, *range(len(parents))], [None, *parents], tokens, fates, strict=True):
        records.append({
            "node": node, "parent": parent, "depth": depth[node], "lane": lanes[node],
            "parent_depth": None if parent is None else depth[parent],
            "parent_lane": None if parent is None else lanes[parent], "token": token,
            "text": "root" if token is None else _shown(decode, token),
            "fate": fate, "stop": node == stop, "wanted_token": after.get(parent),
            "wanted_text": _shown(decode, after.get(parent)), "target_token": after.get(node),
            "target_text": _shown(decode, after.get(node))})
    return pd.DataFrame(records, columns=COLUMNS)
