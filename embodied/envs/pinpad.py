"""PinPad: walk over coloured pads in a fixed order; tasks `pinpad_three` to
`pinpad_eight` (the number of pads). Pure numpy, no extra to install.

The world is a 16 x 14 grid with walls around it; below it a 16 x 2 strip
shows the pads visited so far. Each pad is a block of cells of one colour;
the target sequence visits the pads in the order of their numbers.
"""

import collections

import elements
import numpy as np

from embodied.core import base
from embodied.core import checks
from embodied.envs import adapter

WIDTH, HEIGHT = 16, 14  # The grid with its walls, in cells.
CELL = 4                # Pixels per cell: a 16 x 16 grid gives 64 x 64.
WALL = (192, 192, 192)
SOLVED = (223, 255, 223)  # The background while a solved sequence counts down.
REWARD = 10.0
COUNTDOWN = 10  # Steps from a solved sequence to the respawn.
MOVES = ((0, 0), (0, 1), (0, -1), (1, 0), (-1, 0))  # noop, down, up, right, left

COLORS = {
    '1': (255, 0, 0), '2': (0, 255, 0), '3': (0, 0, 255),
    '4': (255, 255, 0), '5': (255, 0, 255), '6': (0, 255, 255),
    '7': (128, 0, 128), '8': (0, 128, 128),
}

# The rooms inside the outer wall, 14 x 12 cells, one string per row; digits
# are the pads, '.' is floor.
LAYOUTS = {
    'three': (
        '1111......3333', '1111......3333', '1111......3333',
        '1111......3333', '..............', '..............',
        '..............', '..............', '.....2222.....',
        '.....2222.....', '.....2222.....', '.....2222.....'),
    'four': (
        '1111......4444', '1111......4444', '1111......4444',
        '1111......4444', '..............', '..............',
        '..............', '..............', '3333......2222',
        '3333......2222', '3333......2222', '3333......2222'),
    'five': (
        '..........4444', '111.......4444', '111.......4444',
        '111...........', '111........555', '...........555',
        '...........555', '333........555', '333...........',
        '333.......2222', '333.......2222', '..........2222'),
    'six': (
        '111........555', '111........555', '111........555',
        '..............', '33..........66', '33..........66',
        '33..........66', '33..........66', '..............',
        '444........222', '444........222', '444........222'),
    'seven': (
        '111........444', '111........444', '11..........44',
        '..............', '33..........55', '33..........55',
        '33..........55', '33..........55', '..............',
        '66..........22', '666..7777..222', '666..7777..222'),
    'eight': (
        '111..8888..444', '111..8888..444', '11..........44',
        '..............', '33..........55', '33..........55',
        '33..........55', '33..........55', '..............',
        '66..........22', '666..7777..222', '666..7777..222'),
}


def grid(task):
    """The task's cells as an array indexed [x, y]: '#' wall, ' ' floor, or
    a pad's digit."""
    rows = ['#' * WIDTH] + [
        '#' + row.replace('.', ' ') + '#' for row in LAYOUTS[task]] + [
        '#' * WIDTH]
    return np.array([list(row) for row in rows]).T


class PinPad(base.Env):
    """Visit the pads in the order of their numbers for a reward of 10.

    Five actions: stay, down, up, right, left; walls block. Entering a pad
    appends it to the sequence (staying on a pad appends it once); only the
    last as many pads as the task has are kept. When they are the target
    sequence, the step is rewarded, the background turns green and 10
    steps later the player respawns in a random cell with an empty
    sequence. The player cell is black; pads are pale, and in full colour
    while the player stands on them. An episode lasts `length` steps and
    never terminates. `seed` seeds the spawns (None: random).
    """

    def __init__(self, task, length=10000, seed=None):
        checks.choice('PinPad', 'task', task, tuple(LAYOUTS))
        checks.integers('PinPad', 1, length=length)
        self.layout = grid(task)
        self.length = int(length)
        self.pads = sorted(set(self.layout.flatten()) - set('# '))
        self.target = tuple(self.pads)
        self.spawns = [
            cell for cell, char in np.ndenumerate(self.layout) if char != '#']
        self.floor = np.zeros((WIDTH, WIDTH), bool)
        self.floor[:, :HEIGHT] = self.layout == ' '
        self.background = self._background()
        self.rng = np.random.default_rng(seed)
        self.sequence = collections.deque(maxlen=len(self.target))
        self.player = None
        self.steps = 0
        self.countdown = 0
        self.done = True

    @property
    def obs_space(self):
        return {
            'image': elements.Space(
                np.uint8, (CELL * WIDTH, CELL * WIDTH, 3)),
            **base.step_spaces(),
        }

    @property
    def act_space(self):
        return base.discrete_act_space(len(MOVES))

    def step(self, action):
        if self.done or action['reset']:
            self._respawn()
            self.steps = 0
            self.countdown = 0
            self.done = False
            return self._obs(0.0, is_first=True)
        if self.countdown:
            self.countdown -= 1
            if not self.countdown:
                self._respawn()
        self._move(MOVES[int(action['action'])])
        reward = 0.0
        if tuple(self.sequence) == self.target and not self.countdown:
            reward = REWARD
            self.countdown = COUNTDOWN
        self.steps += 1
        self.done = self.steps >= self.length
        return self._obs(reward, is_last=self.done)

    def render(self):
        """The image observation of the current state, uint8 (64, 64, 3)."""
        image = self.background.copy()  # Indexed [x, y].
        if self.countdown:
            image[self.floor] = SOLVED
        here = self.layout[self.player]
        if here in COLORS:
            image[:, :HEIGHT][self.layout == here] = COLORS[here]
        image[self.player] = (0, 0, 0)
        for i, char in enumerate(self.sequence):
            image[2 * i + 1, HEIGHT] = COLORS[char]
        image = image.repeat(CELL, 0).repeat(CELL, 1)
        return image.transpose((1, 0, 2))

    def _background(self):
        """The grid's colours without the player: white floor, grey walls
        and strip, pale pads (a tenth of the colour on white, truncated)."""
        image = np.full((WIDTH, WIDTH, 3), 255, np.uint8)
        image[:, :HEIGHT][self.layout == '#'] = WALL
        for char in self.pads:
            color = (np.array(COLORS[char]) + 9 * 255) / 10
            image[:, :HEIGHT][self.layout == char] = color
        image[:, HEIGHT:] = WALL
        return image

    def _respawn(self):
        self.player = self.spawns[self.rng.integers(len(self.spawns))]
        self.sequence.clear()

    def _move(self, move):
        x = int(np.clip(self.player[0] + move[0], 0, WIDTH - 1))
        y = int(np.clip(self.player[1] + move[1], 0, HEIGHT - 1))
        tile = self.layout[x, y]
        if tile != '#':
            self.player = (x, y)
        if tile in COLORS and (not self.sequence or self.sequence[-1] != tile):
            self.sequence.append(tile)

    def _obs(self, reward, is_first=False, is_last=False):
        return {
            'image': self.render(),
            **adapter.step_values(reward, is_first, is_last, False)}
