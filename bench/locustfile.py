"""Load test with the seed's request mix: 3 short texts to 1 long, over v2 REST and the speech route.

Run against a server that is already up (`make run` in another terminal), headless, with CSV stats:
    make load                 # 16 users for 60 s against http://127.0.0.1:8080
    make load USERS=64 DURATION=5m HOST=http://predictor.example:8080
503 answers (the queue is full: load shedding) are counted as failures by name, so their rate shows.
"""

from locust import HttpUser, between, task

from testing.bodies import speech_request, v2_request

SHORT = "The quick brown fox jumps over the lazy dog."
LONG = " ".join(
    [
        "Serverless speech should cost nothing while idle and still answer the first request quickly.",
        "Under the evening peak it must shed what it cannot serve instead of queuing without bound.",
    ]
    * 4
)


class Listener(HttpUser):
    wait_time = between(0.1, 0.5)

    @task(3)
    def short_text(self) -> None:
        self.client.post("/v2/models/tts/infer", json=v2_request(SHORT), name="v2 short")

    @task(1)
    def long_text_streamed(self) -> None:
        body = speech_request(LONG, stream=True)
        with self.client.post(
            "/v1/audio/speech", json=body, name="speech long (stream)", stream=True, catch_response=True
        ) as response:
            for _ in response.iter_content(chunk_size=65536):
                pass
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200]}")
