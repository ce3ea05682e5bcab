"""tests/mpi/peak_rss.py PREFIX COMMAND...: runs COMMAND and writes its peak resident set in bytes
(getrusage's ru_maxrss of the waited-for child, Linux's VmHWM) to PREFIX.RANK, RANK being the MPI
rank the launcher gives this process (PMI_RANK, 0 without one); exits with COMMAND's status. Run
under mpiexec around each rank: `mpiexec -n 4 python3 tests/mpi/peak_rss.py DIR/run neox-train ...`.
"""
import os
import resource
import subprocess
import sys

status = subprocess.run(sys.argv[2:], close_fds=False).returncode  # (the launcher passes PMI_FD)
kilobytes = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
with open(f"{sys.argv[1]}.{os.environ.get('PMI_RANK', '0')}", "w") as f:
    f.write(f"{kilobytes * 1024}\n")
sys.exit(status if status >= 0 else 128 - status)
