"""``scripts/export_speed.py`` end to end on the tiny model: four systems, each measured, scored and sized."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import SRC, TGT

from nmt_tools.export_speed import main


def test_every_system_is_measured_scored_and_the_runtime_never_imports_torch(tiny_run_dir: Path,
                                                                            tmp_path: Path) -> None:
    source, reference = tmp_path / "src.de", tmp_path / "ref.en"
    source.write_text("".join(line + "\n" for line in SRC), encoding="utf-8")
    reference.write_text("".join(line + "\n" for line in TGT), encoding="utf-8")
    main(["--run", str(tiny_run_dir), "--source", str(source), "--reference", str(reference), "--threads", "1",
          "--latency-sentences", "2", "--out", str(tmp_path / "out")])
    report = json.loads((tmp_path / "out" / "export_speed.json").read_text())
    rows = {(row["system"], row["precision"]): row for row in report["results"]}
    assert set(rows) == {("engine", "fp32"), ("engine", "int8"), ("runtime", "fp32"), ("runtime", "int8")}
    assert rows["runtime", "fp32"]["torch_imported"] is False and rows["engine", "fp32"]["torch_imported"] is True
    for search in ("greedy", "beam5"):
        assert rows["runtime", "fp32"]["searches"][search]["identical_to_engine_fp32"] == len(SRC)
        assert all(row["searches"][search]["sentences_per_s"] > 0 for row in rows.values())
    assert 0 < report["installed_mib"]["runtime"] < report["installed_mib"]["engine"]
    assert "| runtime int8 |" in (tmp_path / "out" / "export_speed.md").read_text()
