"""Regression files: minimal failing cases written under tests/fuzz_regressions/
(replayed by tests/tools/test_fuzz.py), read back and replayed.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import List, Tuple

from tf_fusionstitch.tools.fuzzing.runner import CaseResult, run_cases


# The source tree's tests/fuzz_regressions; an installed package has no source tree
# around it, so there the working directory's fuzz_regressions/.
_SOURCE_TREE_DIR = pathlib.Path(__file__).resolve().parents[3] / "tests" / "fuzz_regressions"
REGRESSIONS_DIR = (_SOURCE_TREE_DIR if _SOURCE_TREE_DIR.parent.is_dir()
                   else pathlib.Path("fuzz_regressions"))


def case_key(case) -> str:
    text = json.dumps({k: case[k] for k in ("inputs", "nodes", "outputs")}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def save_regression(case: dict, result: CaseResult, directory=None, found_by: str = "") -> pathlib.Path:
    directory = pathlib.Path(directory or REGRESSIONS_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    ops = sorted({n["op"] for n in case["nodes"]})
    name = "-".join(ops)[:60] + "-" + case_key(case) + ".json"
    path = directory / name
    record = {"case": case, "draws": max(2, result.draw + 1), "failure": result.problems[:6],
              "found_by": found_by, "status": "open"}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def load_regressions(directory=None) -> List[Tuple[pathlib.Path, dict]]:
    directory = pathlib.Path(directory or REGRESSIONS_DIR)
    if not directory.is_dir():
        return []
    return [(p, json.loads(p.read_text())) for p in sorted(directory.glob("*.json"))]


def replay(record: dict) -> CaseResult:
    return run_cases([record["case"]], draws=int(record.get("draws", 2)))[0]
