"""The pure parts of bench/horovod_examples.py: the one-line import rewrite and its check,
finding the examples in a checkout, and reading the launcher's output.

The bench itself needs torchvision and a Horovod checkout, so it is not run here; these tests
use small made-up example files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.horovod_examples import (
    ELASTIC_EXAMPLE,
    STATIC_EXAMPLE,
    RewriteError,
    changed_lines,
    check_only_import_changed,
    copy_with_import_changed,
    find_example,
    main,
    rewrite_import,
    summarize_output,
)

EXAMPLE = """\
import argparse
# Horovod: the import below is the one to change; this comment mentions horovod.torch.
import horovod.torch as hvd
import numpy as np

hvd.init()
print('import horovod.torch as hvd is what a Horovod user writes')
"""


def test_rewrite_changes_only_the_import_line() -> None:
    after = rewrite_import(EXAMPLE)
    assert after == EXAMPLE.replace(
        "\nimport horovod.torch as hvd\n", "\nimport elastic.torch as hvd\n"
    )
    assert "# Horovod: the import below" in after
    assert "print('import horovod.torch as hvd is what" in after
    assert changed_lines(EXAMPLE, after) == [
        ("import horovod.torch as hvd\n", "import elastic.torch as hvd\n")
    ]
    check_only_import_changed(EXAMPLE, after)


def test_rewrite_keeps_windows_line_endings() -> None:
    source = EXAMPLE.replace("\n", "\r\n")
    after = rewrite_import(source)
    assert "import elastic.torch as hvd\r\n" in after
    assert after.count("\r\n") == source.count("\r\n")
    check_only_import_changed(source, after)


@pytest.mark.parametrize(
    "source",
    [
        "import torch\n",
        "import horovod.torch as hvd\nimport horovod.torch as hvd\n",
        "def f():\n    import horovod.torch as hvd\n",
        "import horovod.tensorflow as hvd\n",
    ],
    ids=["no import", "two imports", "only indented", "another framework"],
)
def test_rewrite_refuses_a_file_without_exactly_one_import(source: str) -> None:
    with pytest.raises(RewriteError, match="expected one line"):
        rewrite_import(source)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda text: text.replace("import numpy as np", "import numpy"),
        lambda text: text + "extra = 1\n",
        lambda text: text.replace("hvd.init()\n", ""),
        lambda text: text.replace("import elastic.torch as hvd", "import horovod.torch as hvd"),
    ],
    ids=["another line edited", "a line added", "a line removed", "import unchanged"],
)
def test_check_refuses_any_change_but_the_import(tamper) -> None:
    after = tamper(rewrite_import(EXAMPLE))
    with pytest.raises(RewriteError, match="not only the import"):
        check_only_import_changed(EXAMPLE, after)


def test_examples_are_found_in_a_checkout_and_in_a_plain_folder(tmp_path: Path) -> None:
    checkout = tmp_path / "horovod"
    static = checkout / "examples" / "pytorch" / STATIC_EXAMPLE
    elastic = checkout / "examples" / "elastic" / "pytorch" / ELASTIC_EXAMPLE
    for path in (static, elastic):
        path.parent.mkdir(parents=True)
        path.write_text(EXAMPLE)
    assert find_example(checkout, STATIC_EXAMPLE) == static
    assert find_example(checkout, ELASTIC_EXAMPLE) == elastic

    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / STATIC_EXAMPLE).write_text(EXAMPLE)
    assert find_example(flat, STATIC_EXAMPLE) == flat / STATIC_EXAMPLE
    with pytest.raises(FileNotFoundError, match=ELASTIC_EXAMPLE):
        find_example(flat, ELASTIC_EXAMPLE)


def test_copy_writes_the_rewritten_example_and_its_diff(tmp_path: Path) -> None:
    original = tmp_path / STATIC_EXAMPLE
    original.write_text(EXAMPLE)
    target = tmp_path / "run"
    target.mkdir()
    copy = copy_with_import_changed(original, target)
    assert copy.copy == target / STATIC_EXAMPLE
    assert copy.copy.read_text() == rewrite_import(EXAMPLE)
    assert original.read_text() == EXAMPLE  # the user's checkout is left as it was
    changes = [
        line
        for line in copy.diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changes == ["-import horovod.torch as hvd", "+import elastic.torch as hvd"]


def test_bench_stops_before_running_when_an_example_cannot_be_rewritten(tmp_path: Path) -> None:
    (tmp_path / STATIC_EXAMPLE).write_text(EXAMPLE)
    (tmp_path / ELASTIC_EXAMPLE).write_text("import torch\n")  # no Horovod import
    out = tmp_path / "out.json"
    assert main(["--examples", str(tmp_path), "--out", str(out)]) == 2
    assert not out.exists()


def test_output_is_read_for_img_sec_and_rounds() -> None:
    lines = [
        "elasticrun: round 1: 2 worker(s) on localhost:2",
        "[0]<stdout>:Iter #0: 10.3 img/sec per CPU",
        "elasticrun: round 2: 3 worker(s) on localhost:2, 127.0.0.1:1 (1 worker(s) joined)",
        "[0]<stdout>:Iter #1: 6.5 img/sec per CPU",
        "elasticrun: round 3: 2 worker(s) on localhost:1, 127.0.0.1:1 (rank 1 on host "
        "localhost was killed by signal SIGKILL (exit code 137))",
        "[0]<stdout>:Img/sec per CPU: 8.4 +-3.7",
        "[0]<stdout>:Total img/sec on 2 CPU(s): 16.8 +-7.4",
    ]
    summary = summarize_output(lines)
    assert [(i["iter"], i["img_sec"], i["device"]) for i in summary["iters"]] == [
        (0, 10.3, "CPU"),
        (1, 6.5, "CPU"),
    ]
    assert (summary["total"]["size"], summary["total"]["img_sec"]) == (2, 16.8)
    assert [(r["round"], r["size"], r["hosts"]) for r in summary["rounds"]] == [
        (1, 2, "localhost:2"),
        (2, 3, "localhost:2, 127.0.0.1:1"),
        (3, 2, "localhost:1, 127.0.0.1:1"),
    ]
    assert summary["rounds"][2]["why"].startswith("rank 1 on host localhost was killed")
    assert summarize_output(["[0]<stdout>:Running warmup..."])["total"] is None
