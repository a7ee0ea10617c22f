"""The product's suite: one module per mode family, generated over every registered backend."""
