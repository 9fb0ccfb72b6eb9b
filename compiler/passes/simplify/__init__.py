"""Graph simplification passes."""
