"""How the stages' results are named in messages and reports, so the build summary, `npubuild
report` and the HTML pages say the same thing: a precision goal as the BUILD file spells it, a
per-layer row's name, which precision an integer model holds."""

from __future__ import annotations


def goal_text(goal: dict) -> str:
    """'cosine >= 0.99', not a Python dict."""
    return ", ".join(f"{k} >= {v:g}" for k, v in goal.items() if v is not None) or "none"


def metrics_text(metrics: dict) -> str:
    """'cosine 0.99912, SQNR 27.72 dB' of a metrics dict with `cosine` and `sqnr_db`."""
    return f"cosine {metrics['cosine']:.5f}, SQNR {metrics['sqnr_db']:.2f} dB"


def search_figures(search: dict) -> str:
    """A precision search's accuracy on the images it searched on and on the held-out ones."""
    split = search.get("search_split")
    if split is None:  # a search.json from before held-out images
        return metrics_text(search)
    text = f"searched on {split['samples']}: {metrics_text(split)}"
    held = search.get("held_out")
    if held is None:
        return text + "; no held-out images"
    return text + f"; held out {held['samples']}: {metrics_text(held)}"


def layer_name(row: dict) -> str:
    """A per-layer report row's name: its node, and which output for a node with several (Split)."""
    return row["node"] + (f" [output {row['output']}]" if "output" in row else "")


def layer_widths(evaluate: dict) -> set[int]:
    """The widths of an evaluated integer model's tensors; an int8 model has two kinds of 16-bit
    tensor by default: a convolution's result that only its activation reads (a fine
    pre-activation, never stored) and the results the network outputs are computed from."""
    return {
        layer["bits"]
        for layer in evaluate["layers"]
        if "bits" in layer and not layer.get("preactivation") and not layer.get("result")
    }


def precision_kind(evaluate: dict) -> str:
    """'int8', or 'mixed int8/int16' when the evaluated integer model holds other widths."""
    widths = layer_widths(evaluate)
    return "int8" if widths <= {8} else "mixed " + "/".join(f"int{b}" for b in sorted(widths))
