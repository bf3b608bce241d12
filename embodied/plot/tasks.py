"""Task names here and in the original's published score files.

The published files name Atari 100k games `atari_<game>` and DMC's
ball_in_cup `dmc_ball_in_cup_<task>`, where our tasks are `atari100k_<game>`
and `dmc_cup_<task>`; every other task has the same name in both.
"""

# (our prefix, the published files' prefix)
ALIASES = (('atari100k_', 'atari_'), ('dmc_cup_', 'dmc_ball_in_cup_'))


def published_names(task):
    """The names `task` may have in a published file, its own first."""
    names = [task]
    for ours, theirs in ALIASES:
        if task.startswith(ours):
            names.append(theirs + task[len(ours):])
    return names


def find(task, known):
    """The first of `published_names(task)` in `known`, or None."""
    return next((x for x in published_names(task) if x in known), None)


def run_task(name, suite):
    """Our task for a published task `name` of `suite` (a file prefix such
    as `atari100k` or `dmc_proprio`); our own names pass unchanged."""
    if name.startswith('dmc_ball_in_cup_'):
        return 'dmc_cup_' + name[len('dmc_ball_in_cup_'):]
    if suite == 'atari100k' and name.startswith('atari_'):
        return 'atari100k_' + name[len('atari_'):]
    return name
