"""One process at a time in a sweep or ladder folder: a lock file holding the owner's pid. A lock left by a process
that is gone (killed, rebooted) is taken over, since its work is on disk and the command resumes it."""
import contextlib
import os

from ms_llm.errors import UserError


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def take(folder, name, flag, stop_hint):
    """Write this process's pid into folder/name, or refuse naming the living owner. `flag` ("--sweep-dir") and
    `stop_hint` ("its trials save a checkpoint") make the refusal's paragraph."""
    path = os.path.join(folder, name)
    try:
        with open(path, encoding="utf-8") as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        pid = 0
    if pid and pid != os.getpid() and alive(pid):
        raise UserError(f"{flag} {folder} is being run by process {pid} (see {path}). Wait for it, or stop it "
                        f"({stop_hint}) and run this command again to resume.")
    with open(path, "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))


def release(folder, name):
    try:
        os.remove(os.path.join(folder, name))
    except OSError:
        pass


@contextlib.contextmanager
def held(folder, name, flag, stop_hint):
    take(folder, name, flag, stop_hint)
    try:
        yield
    finally:
        release(folder, name)
