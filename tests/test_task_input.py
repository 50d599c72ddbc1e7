"""Stepping into a task (docs/reference.md, Input from the tasks): a task's ``input()``,
``getpass`` and pdb prompt in the notebook, naming the task, one task at a time;
``%tfdist_debug`` runs pdb on a task's last exception from the notebook; a task at a prompt is
``prompt``, and neither the stall detector nor the hang rules call the wait for it a stall.

The notebook tests drive a real notebook kernel as JupyterLab does (tests/support/
notebook_kernel.py: execute requests with ``allow_stdin``, every ``input_request`` answered).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.notebook_kernel import answers, notebook_kernel, read_json

pytestmark = pytest.mark.cluster

NO_STDIN = "raw_input was called, but this frontend does not support input requests."
#: a cluster without TensorFlow (these cells need none), reused by ``%%tfcluster 2 workers``
START = ("%load_ext tfdist_nb\nfrom tfdist_nb import Cluster\n"
         "cluster = Cluster(workers=2, preload=()).start()\nprint('run dir', cluster.run_dir)")


@pytest.mark.timeout(300)
def test_prompts_and_the_debugger_go_through_the_notebook(tmp_path: Path) -> None:
    with notebook_kernel(tmp_path) as nb:
        started = nb.run(START)
        assert started.error is None, started.traceback

        # input() on worker:1: the notebook asks, naming the task; the answer reaches it
        ran = nb.run('%%tfcluster 2 workers --on 1\nprint("who is there?")\n'
                     'name = input("your name? ")\nprint("hello", name)', answers("Ada"))
        assert ran.error is None, ran.traceback + ran.text
        assert [p.text for p in ran.prompts] == ["[worker:1] your name? "]
        assert "[worker:1] who is there?" in ran.prompts[0].shown_before  # printed, then asked
        assert "[worker:1] hello Ada" in ran.text
        assert "starting" not in ran.text  # the cluster started above was reused

        # two tasks ask in one cell: prompted in turn, the second after the first's answer
        def slow(text: str, password: bool) -> str:
            time.sleep(1.0)  # the other task asks meanwhile; it must wait its turn
            return f"from {text.split(']')[0].strip('[')}"

        ran = nb.run('%%tfcluster 2 workers\nimport tfdist_nb.worker as tw\n'
                     'said = input(f"{tw.task[1]} says? ")\nprint("heard", said)', slow)
        assert ran.error is None, ran.traceback + ran.text
        assert sorted(p.text for p in ran.prompts) == ["[worker:0] 0 says? ",
                                                       "[worker:1] 1 says? "]
        first, second = ran.prompts
        assert second.at >= first.answered_at
        for task in ("worker:0", "worker:1"):
            assert f"[{task}] heard from {task}" in ran.text

        # getpass keeps its password flag
        ran = nb.run('%%tfcluster 2 workers --on 0\nimport getpass\n'
                     'print("length", len(getpass.getpass("token? ")))', answers("s3cret"))
        assert ran.error is None, ran.traceback + ran.text
        assert [(p.text, p.password) for p in ran.prompts] == [("[worker:0] token? ", True)]
        assert "[worker:0] length 6" in ran.text and "s3cret" not in ran.text

        # breakpoint() in a task cell: pdb's prompts come the same way
        ran = nb.run('%%tfcluster 2 workers --on 1\nv = 7\nbreakpoint()\nprint("after", v)',
                     answers("p v * 6", "c"))
        assert ran.error is None, ran.traceback + ran.text
        assert ran.prompts and all(p.text.startswith("[worker:1] ") for p in ran.prompts)
        assert "[worker:1] 42" in ran.text and "[worker:1] after 7" in ran.text

        # a failing cell, then pdb on worker:1's last exception
        failed = nb.run("%%tfcluster 2 workers --on 1\ndef scale(x):\n    secret = x * 6\n"
                        "    return secret / 0\nscale(7)")
        assert failed.error is not None and failed.error[0] == "TaskError"
        ran = nb.run("%tfdist_debug --on 1", answers("p secret", "up", "pp sorted(locals())",
                                                     "q"))
        assert ran.error is None, ran.traceback + ran.text
        assert {p.text for p in ran.prompts} == {"[worker:1] ipdb> "}
        assert "ZeroDivisionError" in ran.text and "[worker:1] 42" in ran.text
        assert "scale(7)" in ran.text  # up: the cell's own line
        # the default: the first task that raised in the last failing cell
        ran = nb.run("%tfdist_debug", answers("p x", "q"))
        assert ran.error is None, ran.traceback + ran.text
        assert "[worker:1] 7" in ran.text

        # a task that never raised: a clear message, no traceback from inside
        ran = nb.run("%tfdist_debug --on 0", answers())
        assert "UsageError: worker:0 has raised no exception" in ran.text  # IPython's way
        assert "Traceback" not in ran.text and not ran.prompts

        # quitting left worker:1 idle and usable; the cluster answers the next cell
        ran = nb.run('%%tfcluster 2 workers\nprint("alive", tw.task[1])')
        assert ran.error is None, ran.traceback + ran.text
        assert "[worker:0] alive 0" in ran.text and "[worker:1] alive 1" in ran.text

        # a frontend without stdin (nbclient): the task's error is the usual one
        ran = nb.run('%%tfcluster 2 workers --on 1\ninput("x? ")', stdin=False)
        assert ran.error is not None and ran.error[0] == "TaskError"
        assert "StdinNotImplementedError" in ran.text + ran.error[1] + ran.traceback
        assert NO_STDIN in ran.text + ran.traceback
        ran = nb.run("%tfdist_debug --on 1", stdin=False)
        assert "UsageError: this frontend takes no input" in ran.text


#: an all-reduce that worker:1 reaches only after its prompt, and then only after a long sleep
STRATEGY = ("%%tfcluster 2 workers\nimport time\nimport tensorflow as tf\n"
            "import tfdist_nb.worker as tw\n"
            "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
            "strategy.reduce('SUM', strategy.run(lambda: tf.constant(1.0)), axis=None)")
WAIT_FOR_PROMPT = ("%%tfcluster 2 workers --stall-timeout 3\n"
                   "if tw.task[1] == 1:\n"
                   "    input('go on? ')\n"
                   "    time.sleep(120)  # answered, then really stuck before the collective\n"
                   "total = strategy.reduce('SUM', strategy.run(lambda: tf.constant(1.0)), "
                   "axis=None)")


@pytest.mark.timeout(400)
def test_a_prompt_is_no_stall_and_the_hang_after_its_answer_is(tmp_path: Path) -> None:
    with notebook_kernel(tmp_path) as nb:
        ran = nb.run("%load_ext tfdist_nb")
        assert ran.error is None, ran.traceback
        ran = nb.run(STRATEGY, timeout=240)
        assert ran.error is None, ran.traceback + ran.text
        run_dir = Path(ran.text.split("run directory ")[1].split()[0])
        seen: list[dict] = []

        def answer_late(text: str, password: bool) -> str:
            # the prompt stays open for twice the stall timeout while worker:0 waits in its
            # all-reduce for worker:1: state.json shows why, and no alert is raised
            deadline = time.monotonic() + 7
            while time.monotonic() < deadline:
                if (doc := read_json(run_dir / "state.json")) is not None:
                    seen.append(doc)
                time.sleep(0.5)
            return "yes"

        ran = nb.run(WAIT_FOR_PROMPT, answer_late, timeout=120)
        assert [p.text for p in ran.prompts] == ["[worker:1] go on? "]
        tasks = [{t["task"]: t for t in doc["tasks"]} for doc in seen]
        assert any(t["worker:1"]["state"] == "prompt"
                   and t["worker:0"]["waits_for_prompt"] == ["worker:1"] for t in tasks), tasks
        assert seen[-1]["alerts"] == seen[0]["alerts"]  # no stall, no hang said meanwhile
        assert not [a for a in seen[-1]["alerts"] if "stall" in a or "hang" in a]
        # answered, worker:1 then sleeps before its collective: a stall, 3 s after the answer
        assert ran.error is not None and ran.error[0] == "TaskError"
        assert "stalled" in ran.error[1], ran.error
        asked = ran.prompts[0]
        assert ran.seconds >= asked.answered_at - asked.at + 3
        ran = nb.run("from tfdist_nb import current\n"
                     "print(*current().logs(on='0', grep='input prompt')['text'], sep='\\n')")
        assert "waits in all_reduce" in ran.text and "input prompt: not a hang" in ran.text


@pytest.mark.timeout(120)
def test_the_python_api_without_and_with_an_input_handler() -> None:
    from tfdist_nb import Cluster
    from tfdist_nb.errors import SpecError

    with Cluster(workers=2, preload=()) as c:
        with pytest.raises(SpecError, match="no cell of this cluster has failed"):
            c.debug()
        # no handler (a script, nbclient): the same clear error as without tfdist_nb
        r = c.run("input('x? ')", on="1")
        err = r.tasks["worker:1"].error
        assert err is not None and (err.ename, err.evalue) == ("StdinNotImplementedError",
                                                               NO_STDIN)

        states: list[dict[str, str]] = []

        def on_input(task: str, prompt: str, password: bool) -> str:
            states.append(c.status().set_index("task")["state"].to_dict())
            if prompt == "eof? ":
                raise EOFError  # the task's input() raises EOFError, as at a closed stdin
            return f"{task} {prompt} {password}"

        r = c.run("import getpass\nprint(input('a? '))\nprint(getpass.getpass('b? '))\n"
                  "try:\n    input('eof? ')\nexcept EOFError:\n    print('eof')",
                  on="0", on_input=on_input)
        assert r.ok, r.summary()
        assert r.tasks["worker:0"].stdout.splitlines() == ["worker:0 a?  False",
                                                           "worker:0 b?  True", "eof"]
        assert states and all(s == {"worker:0": "prompt", "worker:1": "idle"} for s in states)
        assert set(c.status()["state"]) == {"idle"}

        with pytest.raises(SpecError, match="one task at a time"):
            c.debug(on="all")
