"""Errors that every layer may raise about what a user gave it."""


class BadValue(ValueError):
    """Config values that cannot work; the message names each key.

    `problems` holds one line per bad value; `embodied.main` reports the
    error as a usage error (exit status 2)."""

    def __init__(self, problems):
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = 'Bad config values:\n' + '\n'.join(
                f'  {p}' for p in self.problems)
        super().__init__(message)
