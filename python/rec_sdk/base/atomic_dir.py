"""Publishing files and directories so that a reader sees all of one or none of it, also
after a crash: written into a temporary beside the target, every file and the directory
fsync'ed, then renamed into place and the parent fsync'ed. Temporaries name their writer's
process id, so what a killed writer left can go once that process is gone (never a live
writer's). The table checkpoints (rec_sdk.saver.tables) and the serving update chain
(rec_sdk.serving.update_files) publish through these functions."""

import os
import shutil


def fsync_dir(path):
    """Makes the entries of directory `path` (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path, data):
    """Writes bytes `data` to `path` and fsyncs the file."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_file(path, data):
    """Replaces file `path` by `data` atomically (a temporary of this process, renamed)."""
    parent, name = os.path.split(path)
    tmp = os.path.join(parent, ".%s.tmp-%d" % (name, os.getpid()))
    write_file(tmp, data)
    os.replace(tmp, path)
    fsync_dir(parent or ".")


def publish_dir(staged, final, aside=None):
    """Publishes the written directory `staged` as `final` (same parent): its entries are
    fsync'ed, then it is renamed. An existing `final` is first renamed to `aside` (which the
    caller deletes once the publish is durable); without `aside`, `final` must not exist."""
    fsync_dir(staged)
    if aside is not None and os.path.exists(final):
        os.rename(final, aside)
    os.rename(staged, final)
    fsync_dir(os.path.dirname(final) or ".")


def pid_alive(pid):
    """Whether process `pid` exists (a temporary of a gone writer may go)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_writers(parent, writer_of):
    """Deletes the temporaries in directory `parent` whose writer is gone: writer_of(entry)
    gives an entry's writer process id, or None for an entry that is no temporary. This
    process's own temporaries stay."""
    if not os.path.isdir(parent):
        return
    for entry in os.listdir(parent):
        pid = writer_of(entry)
        if pid is not None and pid != os.getpid() and not pid_alive(pid):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
