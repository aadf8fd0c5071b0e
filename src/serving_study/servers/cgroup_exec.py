"""Join control groups, then become the given command.

    python -m serving_study.servers.cgroup_exec --join FILE [--join FILE ...] -- ARGV...

Writes this process's pid into each `cgroup.procs` FILE, then replaces itself with
ARGV (os.execvp). The command and everything it starts are therefore inside the groups
from their first instruction: no window in which a child escapes the quota.

Uses only the standard library, so it can also be run by file path with `python -I -S`
(that is what `cgroups.wrap_command` does). Exit status 125 means a group could not be
joined and 127 that ARGV could not be started.
"""

import os
import sys

USAGE = "usage: cgroup_exec --join FILE [--join FILE ...] -- ARGV..."


def parse_arguments(arguments: list[str]) -> tuple[list[str], list[str]]:
    """Split the command line into the procs files to join and the command to run."""
    if "--" not in arguments:
        raise ValueError(f"missing `--` before the command. {USAGE}")
    separator = arguments.index("--")
    options, command = arguments[:separator], arguments[separator + 1 :]
    procs_files = []
    while options:
        option = options.pop(0)
        if option != "--join" or not options:
            raise ValueError(f"unexpected {option!r}. {USAGE}")
        procs_files.append(options.pop(0))
    if not procs_files or not command:
        raise ValueError(f"need at least one --join FILE and a command. {USAGE}")
    return procs_files, command


def main(arguments: list[str]) -> int:
    try:
        procs_files, command = parse_arguments(arguments)
    except ValueError as error:
        print(f"cgroup_exec: {error}", file=sys.stderr)
        return 2
    for procs_file in procs_files:
        try:
            with open(procs_file, "w") as file:
                file.write(str(os.getpid()))
        except OSError as error:
            print(
                f"cgroup_exec: cannot join cgroup {procs_file}: {error} "
                "(needs root and an existing group directory)",
                file=sys.stderr,
            )
            return 125
    try:
        os.execvp(command[0], command)
    except OSError as error:
        print(f"cgroup_exec: cannot run {command[0]!r}: {error}", file=sys.stderr)
        return 127
    return 127  # not reached: execvp returns only by raising


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
