"""The README and the commands page name every model alias the code knows (vision ones
included), `images:sample` and the probe corpora; the README's vision command runs as printed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _alias_table() -> set[str]:
    text = (ROOT / "docs" / "commands.md").read_text()
    table = text.split("| alias | weights |", 1)[1].split("\n\n", 1)[0]
    out: set[str] = set()
    for line in table.splitlines()[2:]:
        out.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return out


def test_the_alias_table_lists_every_alias_of_the_code():
    from attnbase.extract.models import ALIASES
    from attnbase.extract.vision import TINY_VISION

    assert set(TINY_VISION) <= set(ALIASES)
    assert _alias_table() == set(ALIASES)


def test_the_readme_names_every_alias_image_corpus_and_probe():
    from attnbase.extract.models import ALIASES
    from attnbase.extract.probes import PREFIX, PROBES
    from attnbase.extract.vision import SAMPLE

    readme = (ROOT / "README.md").read_text()
    missing = [n for n in (*ALIASES, SAMPLE, *(PREFIX + p for p in PROBES))
               if f"`{n}`" not in readme]
    assert not missing


def test_the_readme_vision_command_runs(cli, tmp_path):
    readme = (ROOT / "README.md").read_text()
    line = re.search(r"`(attnbase extract [^`]*images:sample[^`]*)`", readme).group(1)
    args = shlex.split(line)[1:]
    args[args.index("--db") + 1] = str(tmp_path / "db")
    code, out, err = cli(*args)
    assert code == 0, err
    assert "run 'vit-demo' complete: 4 seqs x 21 tokens" in out + err
