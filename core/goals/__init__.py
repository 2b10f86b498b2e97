"""Goals: work that goes on by itself toward a goal a person set, under budgets and
circuit breakers that code enforces.

- `terms`: a goal's settings, what a person writes (`/goal TEXT [budget …]`) and the
  view commands and the dashboard read; plain values and parsing.
- `queue`: the durable queue, goals and tasks as Markdown files in the data dir.
- `engine`: `GoalEngine`, which plans, runs, judges and stops goals.
- `prompts`, `reports`: what the engine asks the model, and what it tells people.

Nothing is imported here, so the chat commands and the CLI can read the terms
without loading the engine.
"""
