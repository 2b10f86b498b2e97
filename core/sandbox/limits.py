"""Resource limits of one sandboxed command, and saying so when one was hit.

Why: the sandbox kept a command from reaching anything, but not from using everything:
1,500 processes, a 3 GB allocation and a 1 GB file all succeeded and could starve
Steward and every other conversation on the machine. Each command now starts under
rlimits set by the shell that starts it (`ulimit`, so no `preexec_fn` in a threaded
process): processes, memory, file size and CPU time, each a setting.

- processes (RLIMIT_NPROC) count per user *and user namespace*: where commands run in
  a user namespace of their own (Steward not root), the count is this command's own
  processes; where Steward is root and commands run as the sandbox user, it is the
  sandbox user's processes of all commands running at that moment.
- memory is RLIMIT_DATA: heap and private writable mappings, not reserved address
  space, so runtimes that reserve large virtual ranges (V8, the JVM, Go) still start.
- CPU time is per process: SIGXCPU at the limit, SIGKILL 5 s later.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

#: Seconds between the soft CPU limit (SIGXCPU) and the hard one (SIGKILL).
CPU_GRACE = 5


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-command limits; 0 means no limit."""

    processes: int = 512
    memory_mb: int = 2048
    file_size_mb: int = 512
    cpu_seconds: int = 600

    def ulimit(self) -> str:
        """The bash `ulimit` line that sets these (empty when there are none)."""
        parts = []
        if self.processes:
            parts.append(f"-u {self.processes}")
        if self.memory_mb:
            parts.append(f"-d {self.memory_mb * 1024}")
        if self.file_size_mb:
            parts.append(f"-f {self.file_size_mb * 1024}")  # 1024-byte blocks in bash
        line = f"ulimit {' '.join(parts)}" if parts else ""
        if self.cpu_seconds:
            cpu = f"ulimit -St {self.cpu_seconds} && ulimit -Ht {self.cpu_seconds + CPU_GRACE}"
            line = f"{line} && {cpu}" if line else cpu
        return line

    def explain(self, returncode: int | None, output: str) -> str:
        """A note for the model when the command seems to have hit a limit, naming the
        limit and the setting that raises it; empty otherwise."""
        notes = []
        code = returncode if returncode is not None else 0
        killed = {128 + signal.SIGXFSZ, -signal.SIGXFSZ}
        if self.file_size_mb and (code in killed or "File size limit exceeded" in output):
            notes.append(
                f"a file may be at most {self.file_size_mb} MB (setting sandbox_max_file_size)"
            )
        cpu = {128 + signal.SIGXCPU, -signal.SIGXCPU}
        if self.cpu_seconds and (code in cpu or "CPU time limit exceeded" in output):
            notes.append(
                f"a process may use at most {self.cpu_seconds} s of CPU (setting sandbox_max_cpu)"
            )
        if self.memory_mb and _MEMORY.search(output):
            notes.append(
                f"a process may allocate at most {self.memory_mb} MB (setting sandbox_max_memory)"
            )
        if self.processes and _PROCESSES.search(output):
            notes.append(
                f"at most {self.processes} processes may run (setting sandbox_max_processes)"
            )
        if not notes:
            return ""
        return "\n[The command hit a limit of Steward's sandbox: " + "; ".join(notes) + ".]"


_MEMORY = re.compile(
    r"MemoryError|Cannot allocate memory|out of memory|std::bad_alloc|"
    r"memory allocation of \d+ bytes failed|JavaScript heap out of memory",
    re.IGNORECASE,
)
_PROCESSES = re.compile(
    r"fork: (retry: )?Resource temporarily unavailable|Cannot fork|"
    r"can't start new thread|pthread_create failed"
)
