"""`otel-replay bench redaction` runs and checks that the gates find what the exact path finds
(structure only, never timing)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from otel_replay.cli import main as cli


def test_cli_prints_the_table_and_writes_the_results(tmp_path):
    path = tmp_path / "redaction.json"
    out = CliRunner().invoke(cli, ["bench", "redaction", "--quick", "--json", str(path)])
    assert out.exit_code == 0, out.output
    assert "prose + 3 secrets" in out.output and "chat span, with a secret" in out.output
    result = json.loads(path.read_text())
    assert result["messages"]["prose + 3 secrets"]["found"] == ["credit_card", "email", "openai_key"]
    assert result["messages"]["English prose"]["found"] == []
    assert set(result["chat_span"]) == {"clean", "with a secret"}
    assert all(row["gated_us"] > 0 and row["exact_us"] > 0 for row in result["chat_span"].values())
