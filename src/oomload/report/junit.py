"""``junit.xml``: one test case per gate rule, or one per finding when the run has no gate.

Gate rules map to JUnit as pass → passed, fail → ``<failure>``, not evaluated → ``<error>`` (a CI
system shows it as broken, never as green). Findings without a gate are informational: each is a
passing test case whose ``<system-out>`` holds the sentence. A run whose requests mostly failed
(``Verdict.failed_run``, exit 3) is an ``<error>`` either way — a test case ``run`` beside the gate
rules, or its ``run_status`` finding — so no CI system shows it green.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from oomload.report.findings import describe
from oomload.verdict import Verdict
from oomload.verdict.gate import GateResult, GateStatus
from oomload.verdict.recommend import Recommendation

SUITE = "oomload"


def render_junit(
    verdict: Verdict, recommendation: Recommendation, gate_results: Sequence[GateResult] = ()
) -> str:
    suites = ET.Element("testsuites", name=SUITE)
    nothing = verdict.failed_run  # the run's requests mostly failed: nothing to judge (exit 3)
    if gate_results:
        suite = ET.SubElement(suites, "testsuite", name=f"{SUITE}.gate")
        for r in gate_results:
            case = ET.SubElement(suite, "testcase", classname=f"{SUITE}.gate", name=r.gate.text)
            if r.status is GateStatus.FAIL:
                ET.SubElement(case, "failure", message=r.reason, type="gate_failed").text = r.reason
            elif r.status is GateStatus.NOT_EVALUATED:
                ET.SubElement(case, "error", message=r.reason, type="gate_not_evaluated").text = r.reason
            else:
                ET.SubElement(case, "system-out").text = r.reason
        failures = sum(r.status is GateStatus.FAIL for r in gate_results)
        errors = sum(r.status is GateStatus.NOT_EVALUATED for r in gate_results)
        tests = len(gate_results)
        if nothing is not None:
            case = ET.SubElement(suite, "testcase", classname=f"{SUITE}.gate", name="run")
            ET.SubElement(case, "error", message=nothing, type="nothing_to_judge").text = nothing
            tests, errors = tests + 1, errors + 1
        suite.set("tests", str(tests))
    else:
        suite = ET.SubElement(suites, "testsuite", name=f"{SUITE}.findings")
        findings = describe(verdict, recommendation)
        failures = errors = 0
        for f in findings:
            case = ET.SubElement(suite, "testcase", classname=f"{SUITE}.findings", name=f.key)
            if f.key == "run_status" and nothing is not None:
                ET.SubElement(case, "error", message=nothing, type="nothing_to_judge").text = nothing
                errors += 1
            else:
                ET.SubElement(case, "system-out").text = f"{f.label}: {f.text}"
        suite.set("tests", str(len(findings)))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suites.set("tests", suite.get("tests", "0"))
    suites.set("failures", str(failures))
    suites.set("errors", str(errors))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
