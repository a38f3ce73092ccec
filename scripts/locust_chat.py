"""Locustfile: streamed chat completions with TTFT and ITL rows (see shared_engine/loadtest/chat_user.py).

    locust -f scripts/locust_chat.py --headless -u 20 -r 5 -t 60s --host http://127.0.0.1:8000 --csv out
"""

from shared_engine.loadtest.chat_user import StreamingChatUser


class ChatUser(StreamingChatUser):
    pass
