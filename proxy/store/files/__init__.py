"""Payload files under the data directory, content-addressed per scope (a tenant, or an end user within it).

A payload lives at ``files/ab/<address>``, where the address is ``sha256(scope NUL sha256(content))``: a scope
only ever deduplicates against its own files, so whether a write happens (and how long it takes) tells it
nothing about what other scopes stored. The ``files`` table keeps the content hash (doctor checks content
against it) and the path, so rows written under another layout stay valid.

Writes go through a ``FileBatch``, one per request: new payloads are written to a private pending folder
and made durable there, then *published* (renamed into place) by the write transaction that stores the rows
referring to them, before it commits; a request that fails before that deletes its pending files and
leaves nothing behind. A published file is never deleted that way: another request of the same scope may
refer to the same content. Files are 0600 in 0700 folders. Reads resolve the path and refuse anything that
leaves the files root, symlinks included: a path comes from the database, and a database is not trusted to
be untampered.

Leftovers: a process killed between writing a pending file and its request's end leaves that file behind, and
one killed between publishing and committing leaves a stored file that no row names. Neither is ever read;
``lcm-proxy doctor`` reports them and ``doctor --repair`` deletes them, and every server start deletes those
older than any request can have been writing them (``proxy.engine.doctor.collect_leftovers``, in the background). The
rule that keeps this safe while a server runs: every process that writes payloads holds a shared lock on
``lcm.writers.lock`` from its first write until it exits (the kernel drops it when the process dies), so
whoever gets the exclusive lock knows no write is in flight, and every leftover it finds is one. Without it,
only files older than ``PENDING_MAX_AGE`` count (no request holds its files that long). A stored file without
a row is deleted only inside a write transaction that re-checks the rows (a publish happens inside its rows'
transaction, so none is half-done then); and a request that found its content already stored, before its
transaction began, checks in that transaction that the file is still there and writes it again if it is not. A
new process's first write also deletes the pending files of dead ones (all of them when it is alone).

The package's modules: ``store`` (addresses, safe reads, integrity checks), ``batch`` (one request's writes),
``leftovers`` (the writers' lock, and finding and deleting what dead processes left) and ``disk`` (durable
writes and folder listings). The names below are the package's front.
"""

from proxy.store.files.disk import DiskFile
from proxy.store.files.leftovers import PENDING, PENDING_MAX_AGE
from proxy.store.files.store import FileStore

__all__ = ["PENDING", "PENDING_MAX_AGE", "DiskFile", "FileStore"]
