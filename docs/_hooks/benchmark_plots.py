"""MkDocs hook: serve the benchmark plots from where the benchmarks write them.

``benchmarks/*.py`` write their PNG plots into ``benchmarks/results/``, outside
``docs/``. Copying them into ``docs/`` would leave two copies to drift apart,
so this hook adds each one to the site as ``benchmarks/plots/NAME.png``
(``docs/benchmarks.md`` shows them from there), and the strict build fails if
a page names a plot that is not there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def on_files(files: Files, *, config: Any) -> Files:
    for plot in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"benchmarks/plots/{plot.name}", abs_src_path=str(plot)))
    return files
