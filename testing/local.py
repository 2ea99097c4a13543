"""`make run`: a local S3 (moto) with the default voice published, then a predictor in the foreground.

    python -m testing.local [--s3-port 9000] [--voice-uri s3://voices/en_US-joe-medium]

An S3 already answering on the port (a previous run's, or a real one) is reused as is. The predictor
logs to this terminal; once it is ready, the playground's URL and ready-to-paste curl commands are printed. Ctrl-C or SIGTERM
stops the predictor (it drains) and the moto server this command started.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from contextlib import ExitStack
from types import FrameType

from testing.polling import GaveUp, answers
from testing.predictor import PredictorProcess
from testing.process import REPO
from testing.s3 import VOICE_URI, MotoServer, aws_env, build_voice, publish_voice

CACHE = REPO / ".cache"
# Cold start on a laptop CPU: download, load and warm-up take well under this.
READY_TIMEOUT_S = 600.0

CURLS = """\
the predictor is ready; open the playground at http://localhost:{http}/ or try:
  curl -s localhost:{http}/v2/models/tts/infer -H 'content-type: application/json' \\
    -d '{{"inputs":[{{"name":"text","datatype":"BYTES","shape":[1],"data":["Hello from the predictor."]}}]}}' | head -c 300
  curl -s localhost:{http}/v1/models/tts:predict -d '{{"instances":[{{"text":"Hello."}}]}}' \\
    | python3 -c 'import sys,json,base64; open("hello.wav","wb").write(base64.b64decode(json.load(sys.stdin)["predictions"][0]["wav_base64"]))'
(Ctrl-C stops it)"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testing.local", description=__doc__.splitlines()[0])
    parser.add_argument("--s3-port", type=int, default=9000, help="port of the local S3 (default 9000)")
    parser.add_argument("--voice-uri", default=VOICE_URI, help=f"where the voice goes (default {VOICE_URI})")
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", "8080")))
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", "8081")))
    args = parser.parse_args(argv)

    # SIGTERM unwinds like Ctrl-C, so the ExitStack stops both children.
    def _term(_sig: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    CACHE.mkdir(exist_ok=True)
    with ExitStack() as stack:
        try:
            endpoint = f"http://127.0.0.1:{args.s3_port}"
            if not answers(endpoint + "/"):
                moto = MotoServer(CACHE / "moto.log", port=args.s3_port)
                stack.callback(moto.stop)
                print(f"local S3 (moto) on {endpoint}, log in {CACHE / 'moto.log'}", flush=True)
            # publish's boto3 client takes its credentials from the environment.
            os.environ.update(aws_env(endpoint))
            publish_voice(build_voice(CACHE / "voice"), args.voice_uri, endpoint)
            print(f"published the default voice to {args.voice_uri}", flush=True)
            env = {
                **aws_env(endpoint),
                "VOICE_URI": args.voice_uri,
                "MODEL_DIR": str(CACHE / "models" / "en_US-joe-medium"),
                "LOG_FORMAT": "text",
                # Event outputs (data.output) may go here and nowhere else; the bucket is not created.
                "CE_OUTPUT_PREFIXES": "s3://tts-events",
                # The page at / for a person trying the voice; every manifest leaves it off.
                "PLAYGROUND": "true",
            }
            predictor = PredictorProcess(env, None, http_port=args.http_port, grpc_port=args.grpc_port)
            stack.callback(predictor.stop)
            predictor.wait_ready(READY_TIMEOUT_S)
            print(CURLS.format(http=args.http_port), flush=True)
            return predictor.proc.wait()
        except (GaveUp, TimeoutError) as exc:
            print(f"make run: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130


if __name__ == "__main__":
    sys.exit(main())
