"""Spend: who every model call is paid for, what it cost, and the caps that stop calls.

- `payer.py`: the context variable naming who a model call is for (person,
  conversation, schedule, goal, purpose), set where work begins and inherited by every
  task it starts, so background calls (learning, proactive wording, goal judging,
  embeddings, workflow drafts, children of `delegate`) are attributed too.
"""
