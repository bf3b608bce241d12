"""Environments. Each suite lives in its own module and imports its third-party
package lazily; `embodied.main.SUITES` maps task suites to constructors."""
