"""Judge a conformance run from the `checks.json` files the CLI writes (one directory per scenario).

    compare.py through DIRECT_DIR THROUGH_DIR [SCENARIO:CHECK | SCENARIO ...]
        Every scenario that passes against the reference server directly passes through the satellite too, and
        every check that succeeds directly succeeds through it (a SHOULD met directly is met through us), except
        the named checks and scenarios, which the caller exempts with a reason it writes down (checks the suite
        only makes when the answer comes as SSE, which the satellite may answer with JSON as the suite allows;
        fixtures the upstream of a cross-era pairing does not serve on its own era's path).
    compare.py applicable DIR SCENARIO...
        Each named scenario passes; checks the suite marks "Not testable" (a fixture tool the endpoint does not
        have, such as on /mcp, where tools are reached through meta-tools) are not counted against it.

A scenario passes when none of its checks has status FAILURE. Prints one line per scenario and exits 1 on a
regression, so CI fails with the names of what broke.
"""
import json
import re
import sys
from pathlib import Path


def scenarios(root: Path) -> dict[str, list[dict]]:
    found = {}
    for checks in sorted(root.glob("*/checks.json")):
        # Directory names are server-<scenario>-<timestamp>.
        name = re.sub(r"-\d{4}-\d{2}-\d{2}T[\dZ-]+$", "", checks.parent.name.removeprefix("server-"))
        found[name] = json.loads(checks.read_text())
    if not found:
        sys.exit(f"no results under {root}: did the conformance run start?")
    return found


def failures(checks: list[dict], tolerate_untestable: bool = False) -> list[str]:
    out = []
    for check in checks:
        if check.get("status") != "FAILURE":
            continue
        message = check.get("errorMessage") or ""
        if tolerate_untestable and message.startswith("Not testable"):
            continue
        out.append(f"{check.get('id')}: {message[:200]}")
    return out


def through(direct_dir: str, through_dir: str, *exempt: str) -> int:
    direct, relayed = scenarios(Path(direct_dir)), scenarios(Path(through_dir))
    unknown = [e for e in exempt if e.split(":")[0] not in direct]
    if unknown:
        sys.exit(f"exempted scenarios the suite did not run: {unknown} (renamed?)")
    broken = exempted = 0
    for name, checks in direct.items():
        if failures(checks):
            print(f"  -  {name}: fails directly too, not compared")
            continue
        if name in exempt:
            exempted += 1
            print(f"  -  {name}: exempted (its fixture is not served on this pairing's upstream)")
            continue
        lost = [f for f in failures(relayed[name]) if f"{name}:{f.split(':')[0]}" not in exempt] \
            if name in relayed else ["not run through the satellite"]
        if name in relayed:
            succeeded = {c.get("id") for c in relayed[name] if c.get("status") == "SUCCESS"}
            lost += [f"{c.get('id')}: succeeds directly, not through the satellite"
                     for c in checks if c.get("status") == "SUCCESS" and c.get("id") not in succeeded
                     and f"{name}:{c.get('id')}" not in exempt]
        if lost:
            broken += 1
            print(f"FAIL {name}: passes directly, fails through the satellite")
            for line in lost:
                print(f"       {line}")
        else:
            print(f"  ok {name}")
    compared = len(direct) - exempted
    print(f"{compared - broken} of {compared} scenarios as good through the satellite as directly"
          + (f" ({exempted} exempted)" if exempted else ""))
    return 1 if broken else 0


def applicable(results_dir: str, names: list[str]) -> int:
    results = scenarios(Path(results_dir))
    broken = 0
    for name in names:
        lost = failures(results[name], tolerate_untestable=True) if name in results else ["not run"]
        if lost:
            broken += 1
            print(f"FAIL {name}")
            for line in lost:
                print(f"       {line}")
        else:
            print(f"  ok {name}")
    return 1 if broken else 0


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    sys.exit(through(*rest) if mode == "through" else applicable(rest[0], rest[1:]))
