"""gymnasium's CartPole-v1 whose 500-step time limit ends the episode as a
termination, as the original's gym adapter reads gym's old API (`done`
marks the step terminal): `--task devtools.cartpole_terminal:CartPole`,
our side of `learning_side_by_side --preset cartpole_terminal`."""

import gymnasium


class TruncationEnds(gymnasium.Wrapper):
    """Reports a truncation as a termination."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated or truncated, False, info


def CartPole():
    return TruncationEnds(gymnasium.make('CartPole-v1'))
