"""Environments. Each suite lives in its own module and imports its third-party
package lazily; `embodied.factories.SUITES` maps task suites to constructors."""
