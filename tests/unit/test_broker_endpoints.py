"""Where a store's ipc sockets live (rmq.actors.broker_endpoints.ipc_dir): in the store directory,
or, for a store path too deep for a Unix socket path, in a private directory named after it."""
import os
import stat

import pytest

from rmq.actors.broker_endpoints import (MAX_IPC_PATH, announce_endpoint, internal_endpoint, ipc_dir,
                                         release_ipc_dir)


def deep(tmp_path, name="s"):
    d = tmp_path / ("d" * 60) / ("e" * 60) / name
    d.mkdir(parents=True)
    return str(d)


def test_a_short_store_path_keeps_its_sockets_in_the_store(tmp_path):
    store = str(tmp_path / "store")
    assert ipc_dir(store) == os.path.abspath(store)
    assert internal_endpoint(store) == f"ipc://{os.path.abspath(store)}/broker.ipc"


def test_a_deep_store_path_gets_a_private_directory_of_its_own(tmp_path):
    a, b = deep(tmp_path, "a"), deep(tmp_path, "b")
    da = ipc_dir(a)
    assert da != a and da == ipc_dir(a) and da != ipc_dir(b)          # stable per store, distinct
    st = os.lstat(da)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
    for ep in (internal_endpoint(a), announce_endpoint(a)):
        assert ep.startswith(f"ipc://{da}/") and len(ep[len("ipc://"):].encode()) <= MAX_IPC_PATH, ep
    db = ipc_dir(b)
    release_ipc_dir(a)
    release_ipc_dir(b)
    assert not os.path.exists(da) and not os.path.exists(db)
    release_ipc_dir(a)                   # already gone: nothing happens


def test_release_removes_the_sockets_and_the_directory_but_nothing_else(tmp_path):
    store = deep(tmp_path)
    d = ipc_dir(store)
    for name in ("broker.ipc", "broker-pub.ipc", "other"):
        with open(os.path.join(d, name), "w"):
            pass
    release_ipc_dir(store)
    assert os.listdir(d) == ["other"]    # a file that is not a broker socket keeps its directory
    os.unlink(os.path.join(d, "other"))
    release_ipc_dir(store)
    assert not os.path.exists(d)
    short = str(tmp_path / "short")
    os.mkdir(short)
    with open(os.path.join(short, "broker.ipc"), "w"):
        pass
    release_ipc_dir(short)               # a store that holds its own sockets is left as it is
    assert os.listdir(short) == ["broker.ipc"]


def test_a_private_directory_that_is_not_ours_is_refused(tmp_path):
    store = deep(tmp_path)
    d = ipc_dir(store)
    os.rmdir(d)
    with open(d, "w"):                   # something else took the name: a file, not our directory
        pass
    try:
        with pytest.raises(OSError, match="refusing to use it"):
            ipc_dir(store)
        release_ipc_dir(store)           # nor removed by it
        assert os.path.isfile(d)
    finally:
        os.unlink(d)
