"""The demo's output piped (``make demo | tee``, a CI log): no table row and no line of
the CLI's output is wrapped (Rich assumes 80 columns when stdout is not a terminal)."""

from __future__ import annotations

from scripts import demo

SUMMARY = {
    "kill -9 -> old driver killed by its watchdog": "4.18 s",
    "tick (@every 5s) fire times through the kill -9": (
        "17: 10 ran, 7 skipped (previous run still running), 0 problems (missed or doubled)"
    ),
}
CLI_LINE = (
    " 2 current running │ 2026-11-26 06:55:07 │ cli:root (claimed) │ clicks:2 │ "
    "resource clicks:1 -> clicks:2"
)


def test_piped_summary_rows_and_cli_lines_are_never_wrapped() -> None:
    console = demo.make_console(terminal=False)
    with console.capture() as captured:
        console.print(demo.summary_table(SUMMARY))
        console.print(CLI_LINE)
    lines = captured.get().splitlines()
    for key, value in SUMMARY.items():
        assert any(key in line and value in line for line in lines), lines
    assert CLI_LINE.rstrip() in [line.rstrip() for line in lines], lines
