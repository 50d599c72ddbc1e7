"""%tfdist_report: a Markdown file to paste into an issue, with the evidence of the last
failure and nothing secret in it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tfdist_nb import Cluster
from tfdist_nb.cluster.export import SecretsWarning
from tfdist_nb.errors import SpecError
from tfdist_nb.redaction import redact

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize(("text", "said"), [
    ("api_key = 'abc123'", "api_key = '<redacted>'"),
    ("WANDB_API_KEY=xyz python train.py", "WANDB_API_KEY=<redacted> python train.py"),
    ('os.environ["HF_TOKEN"] = "hf_abc"', 'os.environ["HF_TOKEN"] = "<redacted>"'),
    ("max_tokens = 128", "max_tokens = 128"),  # not a secret: kept
    ("token_count = 5", "token_count = 5"),
])
def test_what_looks_like_a_secret_is_redacted_and_nothing_else(text: str, said: str) -> None:
    assert redact(text) == said


@pytest.mark.cluster
def test_a_report_of_a_failed_cell_has_its_evidence_and_no_secret(tmp_path: Path) -> None:
    with Cluster(workers=2, preload=(), warm=False, env={"WANDB_API_KEY": "sekrit-env"}) as c:
        assert c.run("api_key = 'sekrit-cell'\nprint('hello', api_key[:2])").ok
        failed = c.run("import tfdist_nb.worker as tw\n"
                       "if tw.task[1] == 1:\n"
                       "    raise ValueError('bad batch on ' + api_key)\n")
        assert not failed.ok
        with pytest.warns(SecretsWarning, match="WANDB_API_KEY, cell 1: api_key"):
            path = c.report(tmp_path / "issue")  # the reproducer beside it keeps them
    text = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert text.startswith(f"# tfdist_nb report: cluster {c.id} (2 workers)")
    assert "Cell 2: " in text and "| worker:1 | error | ValueError: bad batch on <redacted>" in text
    assert "| worker:0 | ok |" in text
    for name, rt in c.tasks.items():
        assert f"- {name}: `" in text and rt.address in text  # its TF_CONFIG
    assert "- `WANDB_API_KEY=<redacted>`" in text
    assert "sekrit" not in text  # neither from the cell, the env nor the tasks' lines
    assert "hello se" in text  # the tasks' last lines are there
    assert {p.name for p in (tmp_path / "issue").iterdir()} == {"report.md", "train.py",
                                                                "launch.sh"}
    # a report.md of the user's own is kept
    own = tmp_path / "mine"
    own.mkdir()
    (own / "report.md").write_text("my notes\n")
    with pytest.raises(SpecError, match="not written by %tfdist_report"):
        c.report(own)
    assert [p.name for p in own.iterdir()] == ["report.md"]  # nothing written beside it
    assert (own / "report.md").read_text() == "my notes\n"
