"""Environments. Each suite lives in its own module and imports its third-party
package lazily; `embodied.factories.SUITES` maps task suites to constructors.
`own` builds a user's own env named by `--task module:attr`, and `checks`
says whether the agent and the runner can take an env's spaces."""
