"""How the stages' results are named in messages and reports, so the build summary, `npubuild
report` and the HTML pages say the same thing: a precision goal as the BUILD file spells it, a
per-layer row's name, which precision an integer model holds."""

from __future__ import annotations


def goal_text(goal: dict) -> str:
    """'cosine >= 0.99', not a Python dict."""
    return ", ".join(f"{k} >= {v:g}" for k, v in goal.items() if v is not None) or "none"


def search_figures(search: dict) -> str:
    """A precision search's accuracy on the images it searched on and on the held-out ones."""
    split = search.get("search_split")
    if split is None:  # a search.json from before held-out images
        return f"cosine {search['cosine']:.5f}, SQNR {search['sqnr_db']:.2f} dB"
    text = f"searched on {split['samples']}: cosine {split['cosine']:.5f}, SQNR {split['sqnr_db']:.2f} dB"
    held = search.get("held_out")
    if held is None:
        return text + "; no held-out images"
    return text + f"; held out {held['samples']}: cosine {held['cosine']:.5f}, SQNR {held['sqnr_db']:.2f} dB"


def layer_name(row: dict) -> str:
    """A per-layer report row's name: its node, and which output for a node with several (Split)."""
    return row["node"] + (f" [output {row['output']}]" if "output" in row else "")


def precision_kind(evaluate: dict) -> str:
    """'int8', or 'mixed int8/int16' when the evaluated integer model holds other widths."""
    widths = {layer["bits"] for layer in evaluate["layers"] if "bits" in layer}
    return "int8" if widths <= {8} else "mixed " + "/".join(f"int{b}" for b in sorted(widths))
