"""redis-py against corral: run by tests/clients.rs as `python3 tests/redis_py_client.py PORT`.

Prints "ok" when every check passes; any failure raises (non-zero exit, traceback on stderr).
"""

import sys

import redis


def check(port: int, protocol: int) -> None:
    r = redis.Redis(port=port, protocol=protocol, decode_responses=True)
    prefix = f"py{protocol}:"
    assert r.ping() is True
    assert r.set(prefix + "k", "v") is True
    assert r.get(prefix + "k") == "v"
    assert r.incr(prefix + "n") == 1
    r.hset(prefix + "h", mapping={"a": "1", "b": "2"})
    assert r.hgetall(prefix + "h") == {"a": "1", "b": "2"}

    # A non-transactional pipeline: one write, replies matched in order.
    p = r.pipeline(transaction=False)
    for i in range(100):
        p.set(f"{prefix}p{i}", i)
        p.get(f"{prefix}p{i}")
    out = p.execute()
    assert out == [x for i in range(100) for x in (True, str(i))], out

    # Connection state that corral keeps per client.
    assert r.client_setname("pyclient") is True
    assert r.client_getname() == "pyclient"
    assert isinstance(r.client_id(), int)

    info = r.info()
    assert "redis_version" in info, sorted(info)
    assert r.echo("hi") == "hi"

    # Errors from Redis come back as exceptions of the right type.
    try:
        r.lpush(prefix + "k", "x")
    except redis.ResponseError as e:
        assert "WRONGTYPE" in str(e), e
    else:
        raise AssertionError("LPUSH on a string did not fail")
    r.close()


def main() -> None:
    port = int(sys.argv[1])
    for protocol in (2, 3):
        check(port, protocol)
    # The RESP3 connection really negotiated RESP3 (HELLO answered by corral).
    r3 = redis.Redis(port=port, protocol=3)
    assert r3.connection_pool.get_connection().get_protocol() in (3, "3")
    print("ok")


if __name__ == "__main__":
    main()
