"""Recipes: YAML run settings named after what they reproduce (``ember pretrain --recipe NAME``).

Each ``NAME.yaml`` here holds the sections of a ``RunConfig`` (model preset, objective, data,
train) with a comment saying which paper and table it follows and how a CPU-sized variant was
scaled. ``load_recipe`` turns a name (or a YAML path) plus ``section.key=value`` overrides into
the ``RunConfig`` that the library functions, the verbs and the experiments all start from.
"""

from __future__ import annotations

from pathlib import Path

from ember.errors import EmberError

RECIPES_DIR = Path(__file__).resolve().parent


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def recipe_path(name: str | Path) -> Path:
    """The YAML file of a recipe name, or ``name`` itself when it is a .yaml path."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    candidate = RECIPES_DIR / f"{name}.yaml"
    if candidate.is_file():
        return candidate
    raise EmberError(f"unknown recipe {str(name)!r}; known recipes: {', '.join(recipe_names())} "
                     "(or pass a .yaml path)")


def load_recipe(name: str | Path, overrides: list[str] | tuple[str, ...] = ()):
    """The RunConfig of a recipe with ``section.key=value`` overrides applied."""
    from ember.config import apply_overrides, load_yaml, run_config_from_dict

    path = recipe_path(name)
    return run_config_from_dict(apply_overrides(load_yaml(path), list(overrides)), where=str(path))
