"""Rendering helpers of the app besides the trajectory (:mod:`mdc_workbench.viz.trajectory_view` draws that):
captions as small chips, per-token log-probabilities, plain tables.

Each is a pure function returning an HTML string; nothing touches gradio or a model. Colours come from the one
confidence colour map (:func:`mdc_workbench.viz.trajectory_view.chip_colours`).
"""

from __future__ import annotations

import html
import math

from mdc_workbench.viz.trajectory_view import CHIP_FONT, chip_colours


def mini_caption_html(tokens: list[str], confidences: list[float] | None) -> str:
    """A caption as small chips (coloured by confidence when given); ``data-caption`` holds the tokens."""
    out = [f'<span class="mdc-caption" data-caption="{html.escape(" ".join(tokens))}">']
    for i, tok in enumerate(tokens):
        bg, fg = chip_colours(confidences[i]) if confidences else ("#eef2ff", "#1f2937")
        tip = f' title="p={confidences[i]:.3f}"' if confidences else ""
        out.append(f'<span{tip} style="display:inline-block;padding:2px 6px;margin:1px;border-radius:6px;'
                   f'background:{bg};color:{fg}"><span style="color:{fg}">{html.escape(tok)}</span></span>')
    return "".join(out) + "</span>"


def table_html(headers: list[str], rows: list[list[str]]) -> str:
    """A plain HTML table; cells are HTML (escape text before passing it)."""
    th = "".join(f'<th style="text-align:left;padding:6px 10px;border-bottom:2px solid #d1d5db">{h}</th>'
                 for h in headers)
    body = "".join("<tr>" + "".join(f'<td style="padding:6px 10px;border-bottom:1px solid #e5e7eb;'
                                    f'vertical-align:top">{c}</td>' for c in row) + "</tr>" for row in rows)
    return (f'<table style="border-collapse:collapse;font-family:{CHIP_FONT};font-size:14px;width:100%">'
            f"<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>")


def logprob_chips_html(tokens: list[str], logprobs: list[float], order: list[int] | None = None) -> str:
    """Per-token log-probabilities as chips coloured by exp(logprob); `order` (0-based reveal steps) numbers them."""
    out = []
    for i, (tok, lp) in enumerate(zip(tokens, logprobs, strict=True)):
        bg, fg = chip_colours(math.exp(lp))
        num = f"#{order[i] + 1} " if order else ""
        out.append(f'<span title="p={math.exp(lp):.3f}" style="display:inline-flex;flex-direction:column;'
                   f'align-items:center;padding:2px 6px;margin:1px;border-radius:6px;background:{bg};color:{fg}">'
                   f'<span style="color:{fg}">{html.escape(tok)}</span>'
                   f'<span style="font-size:10px;color:{fg}">{num}{lp:.2f}</span></span>')
    return "".join(out)
