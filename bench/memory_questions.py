"""Free-text questions about the memory bench's episodes, the way people ask.

The bench's own queries are filled request templates: the very words the episodes were
stored with, which is the easy case for both lists (the same hashed features, the same
rare words). People ask later, and otherwise: "why did the deploy to staging fail last
week?", "what did we do about the billing worker's memory?", with other words for the
same things (prod, stage, the ssl cert), as questions, with typos. Each question here is
made from one stored episode's own fillers (its service, place, file, error), drawn
again from the seed that made it (bench.memory.episode_fields), through a paraphrase of
its request or of its error, never the request text itself.
"""

from __future__ import annotations

import random
from typing import Any

#: Other words for the fillers (what a person says instead of the stored word).
ENV_WORDS = {
    "staging": ["stage", "the staging box", "pre-prod"],
    "production": ["prod", "live", "the production cluster"],
    "dev": ["development", "the dev env"],
    "qa": ["QA", "the test environment"],
    "eu-west": ["Europe", "the EU region"],
    "us-east": ["the US east region", "us east"],
}
SERVICE_FORMS = ["{svc}", "the {svc} worker", "the {svc} service", "{svc}-svc", "our {svc} app"]

#: Paraphrases of each request template of bench.memory.REQUESTS, in its order.
ASK_REQUEST = [
    [
        "why did the deploy of {svc} to {env} fail last week?",
        "did we ever ship {svc} out to {env}?",
    ],
    ["how did we revert {svc} on {env} last time?", "was the {svc} rollback in {env} ok"],
    [
        "what did we do about {svc} crashing over and over in {env}?",
        "{svc} keeps dying on {env}, fix?",
    ],
    ["what made {svc} so sluggish on {env}?", "any idea why {svc} latency went up in {env}"],
    ["what were the sums in {file}?", "remind me what the {file} numbers added up to"],
    ["did we make a graph out of {file} for {who}?", "where's the plot of {file} we did"],
    ["what did the {topic} writeup for {who} say?", "find that {topic} document we sent {who}"],
    ["what was decided in the {topic} meeting?", "recap of the {topic} discussion please"],
    [
        "did we already mail {who} regarding {topic}?",
        "the message to {who} on {topic}, was it sent",
    ],
    ["when did we last renew the ssl cert of {svc}?", "is the {svc} https certificate expiring"],
    ["how did we set {var} for {svc} on {env}?", "is {var} configured in the {svc} env"],
    [
        "did the {svc} db migration on {env} go through?",
        "schema change for {svc} in {env}: status?",
    ],
    ["are the {svc} machines running out of disk space?", "how full are {svc}'s disks"],
    ["what was the {svc} error overnight?", "anything weird in {svc}'s logs yesterday night"],
    ["did the {svc} package upgrade break the test suite?", "bumping {svc} libs: did tests pass"],
    ["what did we learn about other companies' {topic}?", "the comparison of rivals on {topic}"],
    ["do we have a dump of the {svc} db from before migrating?", "{svc} database snapshot, where"],
    ["did someone prune stale {svc} git branches?", "tidy up of the {svc} repo, done?"],
    ["where is the french version of {file}?", "did {file} get translated to french"],
    ["is there a weekly reminder for {topic}?", "the monday nudge about {topic}, still on"],
]
#: Paraphrases of each error template of bench.memory.ERRORS, in its order.
ASK_ERROR = [
    ["why was {var} missing when we ran it?", "what happened with the unset {var}"],
    ["we couldn't find {file}, what did we do?", "the missing {file} problem again"],
    ["what kept timing out after {n} seconds?", "which command hung for {n}s"],
    ["who fixed the permission problem on {svc}'s files?", "access denied writing {svc} stuff"],
    ["why did {svc} refuse connections in {env}?", "{svc} postgres unreachable on {env}?"],
    ["what was wrong with line {n} of {file}?", "the parse failure in {file}"],
    ["what did we do about {svc}'s memory?", "{svc} got OOM killed, how was it solved"],
    ["why did {svc} return bad gateway errors on {env}?", "the 502s from {svc} in {env}"],
]


def _typo(word: str, rng: random.Random) -> str:
    """One typo: two letters swapped, one dropped, or one doubled."""
    at = rng.randrange(1, len(word) - 1)
    kind = rng.randrange(3)
    if kind == 0:
        return word[:at] + word[at + 1] + word[at] + word[at + 2 :]
    if kind == 1:
        return word[:at] + word[at + 1 :]
    return word[:at] + word[at] + word[at:]


def with_typos(text: str, rng: random.Random, count: int) -> str:
    """`text` with `count` typos in words of four letters or more."""
    words = text.split(" ")
    long = [i for i, w in enumerate(words) if len(w) >= 4 and w.isalpha()]
    for i in rng.sample(long, min(count, len(long))):
        words[i] = _typo(words[i], rng)
    return " ".join(words)


def question(
    request_at: int,
    fields: dict[str, Any],
    error_at: int | None,
    error_fields: dict[str, Any] | None,
    rng: random.Random,
) -> str:
    """A free-text question about one episode (its request template's index, its
    fillers, its error template's and fillers if it failed): a paraphrase of its error
    (half the failed ones) or of its request, with other words for its fillers, and
    one or two typos in a third of them."""
    if error_at is not None and error_fields is not None and rng.random() < 0.5:
        template, values = rng.choice(ASK_ERROR[error_at]), error_fields
    else:
        template, values = rng.choice(ASK_REQUEST[request_at]), fields
    env = values["env"]
    said = {
        **values,
        "svc": rng.choice(SERVICE_FORMS).format(svc=values["svc"]),
        "env": rng.choice([env, *ENV_WORDS.get(env, [])]),
        "file": rng.choice([values["file"], "the " + values["file"].replace(".", " ")]),
    }
    text = template.format(**said).replace("the the ", "the ").replace("the our ", "our ")
    if rng.random() < 1 / 3:
        text = with_typos(text, rng, rng.randint(1, 2))
    return text
