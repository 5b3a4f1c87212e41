"""The failure messages of docs/messages.md are those of the current code, each at most 10 lines."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?")


def _script():
    spec = importlib.util.spec_from_file_location("failure_messages", ROOT / "benchmarks" / "failure_messages.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_messages_page_is_current_and_every_message_is_short():
    fm = _script()
    msgs = fm.messages()
    assert len(msgs) == 2 * len(fm.FORMS)
    for name, bug, passed, msg in msgs:
        assert len(msg.splitlines()) <= 10, (name, bug, msg)
        if bug.startswith("gross"):
            assert not passed and "what is wrong:" in msg, (name, msg)
        if not passed:
            assert "what is wrong:" in msg.splitlines()[1]
            assert "worst element at index" in msg and "promise:" in msg.splitlines()[-1]
    # the default catches the subtle bug, the plain max_abs threshold does not (the page says so)
    by = {(name.split(" ")[0], bug.split(":")[0]): passed for name, bug, passed, _ in msgs}
    assert by[("default", "subtle")] is False and by[("`form=None`", "subtle")] is True
    page = fm.page()
    on_disk = (ROOT / "docs" / "messages.md").read_text(encoding="utf-8")
    assert _NUMBER.sub("#", on_disk) == _NUMBER.sub("#", page), (
        "docs/messages.md is not what the code says: python benchmarks/failure_messages.py --write")
