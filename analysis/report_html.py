"""HTML pieces of the report: the inline CSS, tables, number formatting and figures as PNG data URIs.

The report is one file that opens offline, so figures are base64 PNGs inside <img> tags and the CSS is inline.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from pathlib import Path

from scalelab.store.atomic import atomic_write_bytes

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1180px;color:#222}
h1{font-size:24px;margin-bottom:4px} h2{font-size:19px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4} td.l,th.l{text-align:left} .muted{color:#777;font-size:12px}
.warn{background:#fff4e5;border-left:4px solid #f0a020;padding:6px 10px;margin:6px 0;font-size:13px}
.ok{background:#eaf7ea;border-left:4px solid #3a3;padding:6px 10px;margin:6px 0;font-size:13px}
.grid{display:flex;flex-wrap:wrap;gap:10px} figure{margin:0} img{max-width:100%;border:1px solid #eee}
figcaption{font-size:12px;color:#555}
"""


def png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def img(fig, caption: str, width: int = 560) -> str:
    return (
        f'<figure><img alt="{html.escape(caption)}" width="{width}" src="data:image/png;base64,{png(fig)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def html_table(header: list[str], rows: list[list], left: int = 1, left_cols: tuple[int, ...] = ()) -> str:
    """A table; the first `left` columns and those in `left_cols` are left-aligned (text), the rest right.
    An empty `header`: no header row (a table of labelled rows, each label its row's first cell)."""

    def cls(i: int) -> str:
        return "l" if i < left or i in left_cols else ""

    th = "".join(f'<th class="{cls(i)}">{html.escape(str(h))}</th>' for i, h in enumerate(header))
    body = []
    for r in rows:
        tds = "".join(f'<td class="{cls(i)}">{html.escape(fmt(v))}</td>' for i, v in enumerate(r))
        body.append(f"<tr>{tds}</tr>")
    return f"<table>{f'<tr>{th}</tr>' if header else ''}{''.join(body)}</table>"


def write_page(out: str | Path, text: str) -> Path:
    """Write an HTML page whole (atomic), readable as the figures beside it are: mode 0666 less the
    umask (0644 under the usual 022), where the temporary file's 0600 would otherwise stay."""
    out = Path(out)
    atomic_write_bytes(out, text.encode("utf-8"))
    mask = os.umask(0)
    os.umask(mask)
    out.chmod(0o666 & ~mask)
    return out


def fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        if math.isinf(v):
            return "inf"
        return f"{v:.4g}"
    return str(v)
