"""The candidate's process: runs the submitted module, then answers the checker's calls.

Everything here is under the candidate's control once its module has run (it can replace any of these
functions), and that is fine: all this process can do is send values back, and sending a value is what
a function returning it does anyway. It holds no token, no verdict channel and no expected values.

    python -I -S -B worker.py CANDIDATE_PATH REQUEST_FD REPLY_FD
"""

import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wire  # noqa: E402  (the sandbox's own read-only copy)

MESSAGE_LIMIT = 64 << 20


def _error_reply(exc):
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"error": type(exc).__name__, "message": str(exc)[:2000], "traceback": text[-4000:]}


def main():
    candidate_path, request_fd, reply_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sys.argv = [candidate_path]
    namespace = {"__name__": "__main__", "__file__": candidate_path, "__builtins__": __builtins__}
    with open(candidate_path, encoding="utf-8", errors="surrogateescape") as handle:
        source = handle.read()
    try:
        exec(compile(source, "main.py", "exec"), namespace)
    except BaseException as exc:  # SystemExit too: the checker reports it as a failure, not a pass
        wire.send(reply_fd, _error_reply(exc))
        return
    wire.send(reply_fd, {"ready": True})
    refs = []

    def resolve(ref_id):
        if not 0 <= ref_id < len(refs):
            raise wire.WireError("unknown reference")
        return refs[ref_id]

    def lookup(name):
        if name not in namespace:
            raise NameError("name %r is not defined" % name)
        return namespace[name]

    while True:
        request = wire.receive(request_fd, MESSAGE_LIMIT)
        if request is None:
            return
        try:
            if "setup" in request:  # an MBPP setup that builds objects with the candidate's classes
                exec(compile(request["setup"], "setup", "exec"), namespace)
                wire.send(reply_fd, {"ok": None})
                continue
            target = request["call"]
            if isinstance(target, str) and target not in namespace:
                raise NameError("name %r is not defined" % target)
            func = namespace[target] if isinstance(target, str) else resolve(target)
            args = [wire.decode(a, resolve, 0, lookup) for a in request["args"]]
            result = func(*args)
            reply = {"ok": wire.encode(result, refs)}
        except BaseException as exc:
            reply = _error_reply(exc)
        wire.send(reply_fd, reply)


main()
