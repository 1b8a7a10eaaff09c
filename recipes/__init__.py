"""The shipped recipes (YAML files here) and the recipe API: `from fp4cli.recipes import ...`."""

from fp4cli.recipe_loader import apply_overrides, apply_values, list_recipes, load_recipe
from fp4cli.recipe_schema import DEFAULT_SKIP, QRampConfig, Recipe, RecipeError

__all__ = [
    "DEFAULT_SKIP",
    "QRampConfig",
    "Recipe",
    "RecipeError",
    "apply_overrides",
    "apply_values",
    "list_recipes",
    "load_recipe",
]
