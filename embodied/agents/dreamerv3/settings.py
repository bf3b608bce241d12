"""Checks the `agent` config block: every value must be one we implement.
All problems are collected and reported together, in one line."""

import embodied.jax
from embodied.jax import nets

LOSSES = ('rec', 'rew', 'con', 'dyn', 'rep', 'policy', 'value', 'repval')
SCALAR_OUTPUTS = ('symexp_twohot', 'mse', 'symlog_mse')
SCHEDULES = ('const', 'linear', 'cosine')


class UnsupportedConfig(ValueError):
    """An `agent` config value this implementation does not support."""


def check(config):
    errors = []

    def choice(key, value, allowed):
        if value not in allowed:
            errors.append(
                f"agent.{key} is {value!r}; supported: "
                f"{', '.join(map(repr, allowed))}")

    def valid(key, value, parse):
        try:
            parse(value)
        except ValueError as e:
            errors.append(f'agent.{key} is {value!r}: {e}')

    choice('dyn.typ', config.dyn.typ, ('rssm',))
    choice('enc.typ', config.enc.typ, ('simple',))
    choice('dec.typ', config.dec.typ, ('simple',))
    choice('policy_dist_disc', config.policy_dist_disc, ('categorical',))
    choice('policy_dist_cont', config.policy_dist_cont, ('bounded_normal',))
    choice('rewhead.output', config.rewhead.output, SCALAR_OUTPUTS)
    choice('value.output', config.value.output, SCALAR_OUTPUTS)
    choice('conhead.output', config.conhead.output, ('binary',))
    choice('report_gradnorms', config.report_gradnorms, (False,))
    choice('report_openloop', config.report_openloop, (True, False))
    choice('opt.schedule', config.opt.schedule, SCHEDULES)
    for name in ('retnorm', 'valnorm', 'advnorm'):
        choice(
            f'{name}.impl', config[name].impl, embodied.jax.Normalize.IMPLS)
    sections = {
        'dyn.rssm': config.dyn.rssm, 'enc.simple': config.enc.simple,
        'dec.simple': config.dec.simple, 'rewhead': config.rewhead,
        'conhead': config.conhead, 'policy': config.policy,
        'value': config.value}
    for name, section in sections.items():
        if 'act' in section:
            valid(f'{name}.act', section.act, nets.act)
        if 'norm' in section:
            choice(f'{name}.norm', section.norm, nets.Norm.IMPLS)
        if 'winit' in section:
            valid(f'{name}.winit', section.winit, nets.init)
    if set(config.loss_scales) != set(LOSSES):
        errors.append(
            f'agent.loss_scales has keys {sorted(config.loss_scales)}; '
            f'expected {sorted(LOSSES)}')
    rssm = config.dyn.rssm
    if rssm.deter % rssm.blocks:
        errors.append(
            f'agent.dyn.rssm.deter {rssm.deter} must divide into '
            f'rssm.blocks {rssm.blocks}')
    if config.imag_length < 1:
        errors.append(f'agent.imag_length must be >= 1, is {config.imag_length}')
    if config.horizon <= 1:
        errors.append(f'agent.horizon must be > 1, is {config.horizon}')
    rate = config.slowvalue.rate
    if not (rate == 1 or 0 < rate < 0.5):
        errors.append(f'agent.slowvalue.rate must be 1 or in (0, 0.5), is {rate}')
    if errors:
        raise UnsupportedConfig(
            'Unsupported agent config: ' + '. '.join(errors) + '.')
