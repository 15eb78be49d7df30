"""`python -m amp_compare compare|report …` (harness/run/compare.py main; its options: harness/run/cli.py).

Run without nox, on a machine missing a dependency, this says in one line what to install (exit 2)
instead of ending in a ModuleNotFoundError traceback. Standard library only until the check passed.
"""

import sys

from amp_compare.harness.run.requirements import missing_for


def main() -> int:
    problem = missing_for(sys.argv[1] if len(sys.argv) > 1 else "")
    if problem:
        print(f"amp-compare: error: {problem}", file=sys.stderr)
        return 2
    try:
        from amp_compare.harness.run.compare import main as cli_main

        return cli_main()
    except ModuleNotFoundError as exc:  # a module the declared dependencies do not cover
        if exc.name and exc.name.split(".")[0] == "amp_compare":
            raise  # our own code: a bug, keep its traceback
        print(f"amp-compare: error: Python module {exc.name!r} is missing; install the project's dependencies "
              "from its folder with `python3 -m pip install -e '.[compare]'`, or run through nox "
              "(`nox -s compare`).", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
