"""Task kinds used by the engine tests."""

from pycoll import Task


class Manual(Task):
    """Stays in progress until the test calls ``finish()``; records when it starts."""

    def __init__(self, name, log=None, **kw):
        super().__init__(name, **kw)
        self.log = log
        self.finish_now = False

    def post(self):
        if self.log is not None:
            self.log.append(self.name)
        self.progress()

    def progress(self):
        if self.finish_now:
            self.complete()

    def finish(self):
        self.finish_now = True

    def reset(self):
        super().reset()
        self.finish_now = False


class Recorder(Task):
    """Completes at once, appending its name to ``log``."""

    def __init__(self, name, log, **kw):
        super().__init__(name, **kw)
        self.log = log

    def post(self):
        self.log.append(self.name)
        self.complete()


class Boom(Task):
    """Raises from post (``when="post"``) or from the first progress call."""

    def __init__(self, name="boom", when="post", exc=None, **kw):
        super().__init__(name, **kw)
        self.when = when
        self.exc = exc or RuntimeError(f"{name} exploded")

    def post(self):
        if self.when == "post":
            raise self.exc

    def progress(self):
        raise self.exc
