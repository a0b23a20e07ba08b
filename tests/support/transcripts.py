"""Generated conversation material: long histories, pasted documents, code."""

from __future__ import annotations

from typing import Any


def blocks(count: int, seed: str = "doc") -> str:
    """``count`` distinct <file> blocks of plain prose (free text: the kind the summary model explores)."""
    body = "The committee met on a rainy Tuesday and went through the minutes of the previous meeting. " * 6
    return "\n".join(f'<file name="{seed}-{i}.txt">{seed} number {i}. {body}</file>' for i in range(count))


CODE = "".join(
    f"def handler_{i}(request):\n    return {{'status': {i}, 'items': [x * {i} for x in range(9)]}}\n"
    for i in range(300)
)


def long_history(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "Be helpful."}]
    for i in range(turns):
        out.append({"role": "user", "content": f"Question {i}: " + "tell me more about the design of the system. " * 8})
        out.append(
            {"role": "assistant", "content": f"Answer {i}: " + "the design has several layers and invariants. " * 8}
        )
    out.append({"role": "user", "content": "What did we decide?"})
    return out
