"""MkDocs hooks: the benchmarks page is bench/README.md itself, and links to files outside
docs/ lead to their page on the site.

bench/README.md stays where the benchmarks are (it is what ``python -m bench.run`` users
read); the site shows it as ``benchmarks/index.md``, with its images, and its links into
docs/ pointed at the pages. A docs page that links to ``../bench/README.md`` (right on
GitHub) is pointed at that page in the site.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
PAGE = "benchmarks/index.md"


def on_files(files: Files, config: Any) -> Files:
    text = (BENCH / "README.md").read_text()
    text = text.replace("](../docs/", "](../")  # benchmarks/index.md sits one level down
    files.append(File.generated(config, PAGE, content=text))
    for image in sorted((BENCH / "results").glob("*.png")):
        files.append(File.generated(config, f"benchmarks/results/{image.name}",
                                    abs_src_path=str(image)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri == PAGE:
        return markdown
    depth = page.file.src_uri.count("/")
    up = "../" * (depth + 1)  # from the page's folder to the repository's root
    site = "../" * depth + "benchmarks/index.md"
    return re.sub(rf"\]\({re.escape(up)}bench/README\.md", f"]({site}", markdown)
