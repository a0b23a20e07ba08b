"""``lcm_describe`` with an end line before the start line: an error the model (or operator) can fix, not
"Lines 10-10" of something nobody asked for."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.support.engine import run
from tests.support.recall import setup


def test_an_end_line_before_the_start_line_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine, tools, scope, _, file_id = await setup(tmp_path)
        text = await tools.run(
            scope, "lcm_describe", orjson.dumps({"id": file_id, "start_line": 10, "end_line": 5}).decode()
        )
        assert "'end_line' (5) is before 'start_line' (10)" in text and "Lines 10-10" not in text
        same = await tools.run(
            scope, "lcm_describe", orjson.dumps({"id": file_id, "start_line": 10, "end_line": 10}).decode()
        )
        assert "Lines 10-10 of 800" in same and "line 10: the quick brown fox 70" in same
        await engine.store.close()

    run(scenario())
