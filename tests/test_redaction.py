"""The one secret detector (tfdist_nb/redaction.py) against a table of secret shapes, each
asserted absent from what it hides, beside the look-alikes it must leave alone; and the report's
text, every field of it, made from a cluster's worth of secrets.

The values below are made up in the formats of the real thing (no real credential is here).
"""

from __future__ import annotations

import pytest

from tfdist_nb.cluster.export import secrets as export_findings
from tfdist_nb.cluster.report import HIDDEN, markdown
from tfdist_nb.redaction import REDACTED, redact, secret_name, secret_values
from tfdist_nb.results import RemoteError, RunResult, TaskResult, TaskStatus

AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"
PAT = "ghp_" + "A1b2C3d4E5f6G7h8I9j0" * 2
BEARER = ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
          "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U")
DB_PASSWORD = "s3cr3t-pw"
AZURE_KEY = "Zm9vYmFyYmF6cXV4cXV1eA=="

# (where it turns up, the text, the secret that must not survive)
TABLE = [
    ("--env", f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}", AWS_SECRET),
    ("--env", f"DATABASE_URL=postgres://app:{DB_PASSWORD}@db:5432/x", DB_PASSWORD),
    ("--env", f"GITHUB_PAT={PAT}", PAT),
    ("--env", "AZURE_STORAGE_CONNECTION_STRING=DefaultEndpointsProtocol=https;AccountName=a;"
              f"AccountKey={AZURE_KEY};EndpointSuffix=core.windows.net", AZURE_KEY),
    ("--env", "SENTRY_DSN=https://0a1b2c3d4e5f@o1.ingest.sentry.io/42", "0a1b2c3d4e5f"),
    ("--env", "KAGGLE_KEY=0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef"),
    ("--env", "NPM_AUTH=bnBtOnNlY3JldHRva2Vu", "bnBtOnNlY3JldHRva2Vu"),
    ("--env", "SECRET_KEY=django-insecure-x1y2z3", "django-insecure-x1y2z3"),
    ("--env", "API_KEY_PROD=prodkey-998877", "prodkey-998877"),
    ("--env", "PASSWORD_PROD=hunter2hunter2", "hunter2hunter2"),
    ("--env", "PRIVATE_KEY_PEM=/keys/id_rsa.pem", "/keys/id_rsa.pem"),
    ("cell", 'token_hint = "tk-1234-5678"', "tk-1234-5678"),
    ("cell", 'headers = {"Authorization": "Bearer ' + BEARER + '"}', BEARER),
    ("cell", 'os.environ["HF_TOKEN"] = "hf_short"', "hf_short"),
    ("cell", "wandb_api_key='0f1e2d3c4b5a'", "0f1e2d3c4b5a"),
    ("error", f"RuntimeError: upload failed for Bearer {BEARER} (403)", BEARER),
    ("error", "HTTPError: 401 for https://user:pa55word@example.org/upload", "pa55word"),
    ("line", "Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    ("line", "using key AKIAIOSFODNN7EXAMPLE for s3", "AKIAIOSFODNN7EXAMPLE"),
    ("line", "slack xoxb-123456789012-abcdefABCDEF posted", "xoxb-123456789012-abcdefABCDEF"),
    ("line", "hf_" + "x" * 34 + " loaded", "hf_" + "x" * 34),
    ("line", "glpat-" + "a1B2" * 5 + " ok", "glpat-" + "a1B2" * 5),
    ("line", "openai sk-" + "p" * 32, "sk-" + "p" * 32),
    ("line", "maps AIza" + "S" * 35, "AIza" + "S" * 35),
    ("line", "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "MIIEow"),
]

# look-alikes that are no secret: left exactly as they are
KEPT = ["max_tokens = 512", "token_count = 5", 'tokenizer = "bert-base"', 'author = "Ada"',
        "KEYBOARD=us", "TF_CPP_MIN_LOG_LEVEL=2", "KeyError: 'x'", "monkey_patch = True",
        "https://example.org/data.csv", "Invalid token provided by the server"]


@pytest.mark.parametrize(("where", "text", "secret"), TABLE,
                         ids=[f"{w}:{t.split('=')[0][:24]}" for w, t, _ in TABLE])
def test_every_secret_shape_is_hidden(where: str, text: str, secret: str) -> None:
    hidden = redact(text)
    assert secret not in hidden and REDACTED in hidden


@pytest.mark.parametrize("text", KEPT)
def test_what_only_looks_like_a_secret_is_kept(text: str) -> None:
    assert redact(text) == text


def test_names_with_a_secret_word_anywhere_are_secret_names() -> None:
    for name in ("AWS_SECRET_ACCESS_KEY", "GITHUB_PAT", "SENTRY_DSN", "NPM_AUTH", "TOKEN_HINT",
                 "API_KEY_PROD", "PASSWORD_PROD", "PRIVATE_KEY_PEM", "KAGGLE_KEY",
                 "AZURE_STORAGE_CONNECTION_STRING", "Authorization", "db_passwd"):
        assert secret_name(name), name
    for name in ("MAX_TOKENS", "TOKENIZERS_PARALLELISM", "AUTHOR", "KEYBOARD", "PATH",
                 "TF_CONFIG", "CUDA_VISIBLE_DEVICES"):
        assert not secret_name(name), name


def test_a_value_found_once_is_hidden_wherever_it_turns_up() -> None:
    env = {"GITHUB_PAT": PAT, "DATABASE_URL": f"postgres://app:{DB_PASSWORD}@db/x",
           "EPOCHS": "3"}
    found = secret_values(['token_hint = "tk-1234-5678"'], env)
    printed = f"cloning with {PAT}; hint tk-1234-5678; url postgres://app:{DB_PASSWORD}@db/x"
    hidden = redact(printed, found)
    assert PAT not in hidden and "tk-1234-5678" not in hidden and DB_PASSWORD not in hidden
    assert "3" not in found  # a value that is no secret is not hunted (it would match anywhere)


def test_the_report_hides_every_secret_in_every_field() -> None:
    """The report's fields, each carrying secrets: the failing cell and its summary, the task
    table's error, the explanation, the env, the alerts, the last lines and the ledger."""
    env = {k: v for k, v in (line.split("=", 1) for w, line, _ in TABLE if w == "--env")}
    env["EPOCHS"] = "3"
    cell = "\n".join(t for w, t, _ in TABLE if w == "cell")
    errors = [t for w, t, _ in TABLE if w == "error"]
    lines = [t for w, t, _ in TABLE if w == "line"]
    failing = TaskResult("worker:1", TaskStatus.ERROR, error=RemoteError(
        "RuntimeError", errors[0].split(": ", 1)[1], errors), explanation=errors[1])
    released = TaskResult("worker:0", TaskStatus.ABORTED)
    text = markdown(
        cluster_id="c", spec="2 workers", tasks=[{"task": "worker:0", "host": "h"}],
        tf_configs={"worker:0": "{}"}, env=env, alerts=[f"worker:1: {errors[0]}"],
        failure=RunResult(2, {"worker:0": released, "worker:1": failing}),
        failed_code=cell, last_lines={"worker:1": lines, "worker:0": [f"GITHUB_PAT={PAT}"]},
        ledger=[{"task": "worker:0", "kind": "all_reduce", "where": f"uploading {BEARER}"}],
        secrets=secret_values([cell], env))
    for _, _, secret in TABLE:
        assert secret not in text, secret
    assert f"- `EPOCHS={HIDDEN}`" in text  # --env values hidden unless asked for
    shown = markdown(cluster_id="c", spec="2 workers", tasks=[], tf_configs={}, env=env,
                     alerts=[], failure=None, failed_code=None, last_lines={}, ledger=[],
                     show_env=True)
    assert "- `EPOCHS=3`" in shown and f"- `GITHUB_PAT={REDACTED}`" in shown
    assert PAT not in shown and AWS_SECRET not in shown


def test_the_exporters_warning_names_what_the_report_hides_and_shows_no_value() -> None:
    env = {"GITHUB_PAT": PAT, "DATABASE_URL": f"postgres://app:{DB_PASSWORD}@db/x",
           "EPOCHS": "3"}
    cells = [{"cell": 2, "code": 'token_hint = "tk-1234-5678"\nx = 1'},
             {"cell": 3, "code": f'requests.get("https://u:{DB_PASSWORD}@h/x")'}]
    found = export_findings(cells, env)
    assert found == ["launch.sh: DATABASE_URL", "launch.sh: GITHUB_PAT", "cell 2: token_hint",
                     "cell 3: URL credentials"]
    assert not any(DB_PASSWORD in f or PAT in f for f in found)
