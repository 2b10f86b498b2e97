"""core/lazy_package.py: the LINE SDK loads only what the adapter uses, and still
offers everything else it has when asked (resident memory)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_line_adapter_skips_the_sdk_package_inits() -> None:
    out = run(
        """
        import sys
        import adapters.line
        models = [m for m in sys.modules if m.startswith("linebot.v3.messaging.models.")]
        # the package __init__s have not run: only the adapter's classes and their imports
        print(len(models) < 150, "__getattr__" in vars(sys.modules["linebot.v3.messaging"]))
        """
    )
    assert out == "True True"


def test_names_the_adapter_does_not_use_still_resolve() -> None:
    out = run(
        """
        import adapters.line
        import linebot.v3.messaging.models as models
        from linebot.v3.messaging import BroadcastRequest, MessagingApi, TextMessage
        from linebot.v3.messaging.models import TextMessage as Same
        print(TextMessage is Same, BroadcastRequest.__name__, MessagingApi.__name__)
        print(getattr(models, "PushMessageResponse").__module__)
        """
    )
    assert out.splitlines() == [
        "True BroadcastRequest MessagingApi",
        "linebot.v3.messaging.models.push_message_response",
    ]


def test_a_name_the_init_computes_runs_the_whole_init_once() -> None:
    out = run(
        """
        import adapters.line
        import linebot.v3.messaging as messaging
        hasattr(messaging, "__all__")  # not imported by its __init__: runs the whole of it
        print("__getattr__" in vars(messaging), "AsyncMessagingApiBlob" in vars(messaging))
        try:
            messaging.NoSuchThing
        except AttributeError as exc:
            print("AttributeError", "NoSuchThing" in str(exc))
        """
    )
    assert out.splitlines() == ["False True", "AttributeError True"]


def test_litellm_in_a_thread_and_the_line_adapter_on_the_main_one_both_load() -> None:
    # what `steward run` does: App.warm_up imports litellm (openai.types deferred) in a
    # worker thread while the adapters import on the event loop's thread
    out = run(
        """
        import threading
        from core.model.client import load_litellm
        box = []
        worker = threading.Thread(target=lambda: box.append(load_litellm()))
        worker.start()
        import adapters.line
        from linebot.v3.messaging import FlexMessage
        worker.join(120)
        import openai.types.chat as chat
        print(box[0].__name__, FlexMessage.__name__, chat.ChatCompletion.__name__)
        """
    )
    assert out == "litellm FlexMessage ChatCompletion"
