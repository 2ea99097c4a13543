// The playground: POST /v1/audio/speech with stream: true, play WAV/PCM as it arrives through Web Audio,
// and offer what arrived for download. No framework and no build step: the predictor serves this file
// as it is.
//
// Gap-free playback: every decoded piece is scheduled on the AudioContext's clock right where the
// previous one ends (counted in sample frames, so rounding never opens a gap); only when the network
// falls behind the clock does playback restart a little ahead of "now", and that counts as a stall.
//
// window.playground.events holds performance.now() stamps of what happened (request-start,
// first-chunk, first-audio, response-end, played), so a test can prove the order of events.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  // How far ahead of the audio clock the first piece (or the first after a stall) is scheduled, s:
  // enough for the audio thread to pick it up, short enough not to show in the time to first audio.
  const LEAD_S = 0.05;
  const STREAMED = new Set(["wav", "pcm"]);
  const MEDIA_TYPES = { wav: "audio/wav", pcm: "audio/pcm", mp3: "audio/mpeg", flac: "audio/flac", opus: "audio/ogg" };
  const EXTENSIONS = { wav: "wav", pcm: "pcm", mp3: "mp3", flac: "flac", opus: "ogg" };

  const pg = (window.playground = { events: [], model: null, sampleRate: null, ready: false });
  let ctx = null; // one AudioContext, made on the first Speak: browsers start audio on a user gesture
  let current = null; // the run in progress
  let downloadUrl = null;

  function mark(name, detail) {
    pg.events.push({ name, t: performance.now(), ...detail });
  }

  function setState(text) {
    $("state").textContent = text;
  }

  function showError(message) {
    $("error").textContent = message || "";
    $("error").hidden = !message;
  }

  function concat(a, b) {
    const out = new Uint8Array(a.length + b.length);
    out.set(a, 0);
    out.set(b, a.length);
    return out;
  }

  function ascii(bytes, at, n) {
    return String.fromCharCode(...bytes.subarray(at, at + n));
  }

  // A WAV header's fields once enough bytes have arrived to hold it (null: not yet). The server's
  // streamed WAV says "unknown length" in its size fields, so the data chunk's size is not used.
  function parseWavHeader(bytes) {
    if (bytes.length < 12) return null;
    if (ascii(bytes, 0, 4) !== "RIFF" || ascii(bytes, 8, 4) !== "WAVE") {
      throw new Error("the server's stream is not a WAV file");
    }
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
    let fmt = null;
    for (let at = 12; at + 8 <= bytes.length; ) {
      const id = ascii(bytes, at, 4);
      const size = view.getUint32(at + 4, true);
      if (id === "data") {
        if (!fmt) throw new Error("WAV stream has its data before its fmt chunk");
        return { ...fmt, dataOffset: at + 8 };
      }
      if (at + 8 + size > bytes.length) return null;
      if (id === "fmt ") {
        const code = view.getUint16(at + 8, true);
        fmt = {
          channels: view.getUint16(at + 10, true),
          rate: view.getUint32(at + 12, true),
          bits: view.getUint16(at + 22, true),
        };
        // 1: PCM; 0xFFFE: WAVE_FORMAT_EXTENSIBLE, still integer PCM at these bit depths.
        if ((code !== 1 && code !== 0xfffe) || fmt.bits !== 16) {
          throw new Error(`the page plays 16-bit PCM WAV; the stream is format ${code}, ${fmt.bits} bits`);
        }
      }
      at += 8 + size + (size & 1);
    }
    return null;
  }

  // Turns arriving bytes (WAV or raw PCM16) into mono float samples; a sample split across two
  // network chunks is carried over to the next.
  class PcmDecoder {
    constructor(format, rate) {
      this.head = format === "wav" ? new Uint8Array(0) : null;
      this.rate = rate;
      this.channels = 1;
      this.dataOffset = 0;
      this.carry = new Uint8Array(0);
      this.frames = 0;
    }

    push(bytes) {
      if (this.head !== null) {
        this.head = concat(this.head, bytes);
        const header = parseWavHeader(this.head);
        if (!header) return new Float32Array(0);
        this.rate = header.rate;
        this.channels = header.channels;
        this.dataOffset = header.dataOffset;
        bytes = this.head.subarray(header.dataOffset);
        this.head = null;
      }
      if (this.carry.length) bytes = concat(this.carry, bytes);
      const frameBytes = 2 * this.channels;
      const usable = bytes.length - (bytes.length % frameBytes);
      this.carry = bytes.slice(usable);
      const view = new DataView(bytes.buffer, bytes.byteOffset, usable);
      const out = new Float32Array(usable / frameBytes);
      for (let i = 0; i < out.length; i++) {
        let sum = 0;
        for (let c = 0; c < this.channels; c++) sum += view.getInt16(i * frameBytes + 2 * c, true);
        out[i] = sum / this.channels / 32768;
      }
      this.frames += out.length;
      return out;
    }
  }

  // Schedules pieces back to back on the audio clock.
  class Player {
    constructor(run) {
      this.run = run;
      this.sources = [];
      this.origin = 0; // audio-clock time of frame 0 of the current stretch
      this.frames = 0; // frames scheduled since origin
      this.rate = 0;
      this.stalls = 0;
      this.endsAt = 0;
    }

    play(samples, rate) {
      if (!samples.length) return;
      const now = ctx.currentTime;
      if (this.rate !== rate || this.origin + this.frames / rate < now + 0.005) {
        if (this.rate) this.stalls += 1; // the network fell behind the clock: a gap is unavoidable
        this.origin = now + LEAD_S;
        this.frames = 0;
        this.rate = rate;
      }
      const buffer = ctx.createBuffer(1, samples.length, rate);
      buffer.copyToChannel(samples, 0);
      const source = ctx.createBufferSource();
      source.buffer = buffer;
      source.connect(ctx.destination);
      const at = this.origin + this.frames / rate;
      source.start(at);
      this.sources.push(source);
      this.frames += samples.length;
      this.endsAt = this.origin + this.frames / rate;
      if (this.run.firstAudioMs === null) {
        // When the first sample will actually sound, on the page's clock.
        const ms = performance.now() - this.run.t0 + (at - now) * 1000;
        this.run.firstAudioMs = ms;
        $("first-audio-ms").textContent = String(Math.round(ms));
        setState("playing");
        mark("first-audio", { ms });
      }
      $("stalls").textContent = String(this.stalls);
    }

    // Resolves when the last scheduled piece has played.
    finished() {
      const last = this.sources[this.sources.length - 1];
      if (!last) return Promise.resolve();
      return new Promise((resolve) => {
        last.addEventListener("ended", resolve, { once: true });
      });
    }

    stop() {
      for (const source of this.sources) {
        try {
          source.stop();
        } catch (_) {
          // never started: nothing to stop
        }
      }
    }
  }

  function offerDownload(chunks, format, decoder) {
    let bytes = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
    let at = 0;
    for (const c of chunks) {
      bytes.set(c, at);
      at += c.length;
    }
    if (format === "wav" && decoder && decoder.dataOffset >= 8) {
      // The stream's header says "unknown length"; a saved file says how long it is.
      const view = new DataView(bytes.buffer);
      const dataBytes = bytes.length - decoder.dataOffset;
      view.setUint32(4, bytes.length - 8, true);
      view.setUint32(decoder.dataOffset - 4, dataBytes - (dataBytes % (2 * decoder.channels)), true);
    }
    if (downloadUrl) URL.revokeObjectURL(downloadUrl);
    downloadUrl = URL.createObjectURL(new Blob([bytes], { type: MEDIA_TYPES[format] }));
    const link = $("download");
    link.href = downloadUrl;
    link.download = `speech.${EXTENSIONS[format]}`;
    link.textContent = `Download speech.${EXTENSIONS[format]} (${(bytes.length / 1024).toFixed(0)} KiB)`;
    link.hidden = false;
  }

  async function serverError(response) {
    try {
      const body = await response.json();
      if (body && body.error) return String(body.error);
    } catch (_) {
      // not JSON: fall through to the status line
    }
    return `HTTP ${response.status} ${response.statusText}`.trim();
  }

  function resetOutputs() {
    showError("");
    for (const id of ["first-audio-ms", "rtf", "audio-seconds", "stalls"]) $(id).textContent = "";
    $("download").hidden = true;
  }

  async function speak() {
    if (current) current.abort();
    resetOutputs();
    if (!pg.model) {
      showError("the model's metadata has not loaded yet; is the predictor ready?");
      setState("error");
      return;
    }
    const format = $("format").value;
    const speed = Number($("speed").value);
    const voice = $("voice").value;
    if (!ctx) ctx = pg.sampleRate ? new AudioContext({ sampleRate: pg.sampleRate }) : new AudioContext();
    if (ctx.state === "suspended") await ctx.resume();

    const controller = new AbortController();
    const run = { t0: performance.now(), firstAudioMs: null, aborted: false };
    const player = new Player(run);
    run.abort = () => {
      run.aborted = true;
      controller.abort();
      player.stop();
      setState("stopped");
    };
    current = run;
    $("stop").disabled = false;
    setState("requesting");
    pg.events = [];
    mark("request-start");

    const body = { model: pg.model, input: $("text").value, response_format: format, stream: true };
    if (Number.isFinite(speed) && $("speed").value !== "") body.speed = speed;
    if (voice) body.voice = voice;
    const decoder = STREAMED.has(format) ? new PcmDecoder(format, pg.sampleRate) : null;
    const chunks = [];
    try {
      const response = await fetch("/v1/audio/speech", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!response.ok) throw new Error(await serverError(response));
      const reader = response.body.getReader();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        if (!chunks.length) mark("first-chunk", { bytes: value.length });
        chunks.push(value);
        if (decoder) player.play(decoder.push(value), decoder.rate);
      }
      const elapsedS = (performance.now() - run.t0) / 1000;
      mark("response-end", { bytes: chunks.reduce((n, c) => n + c.length, 0) });
      let audioS;
      if (decoder) {
        audioS = decoder.frames / decoder.rate;
      } else {
        // Compressed formats: decoded once whole (a partial MP3/Opus page is not decodable on its own).
        const whole = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
        let at = 0;
        for (const c of chunks) {
          whole.set(c, at);
          at += c.length;
        }
        const decoded = await ctx.decodeAudioData(whole.buffer);
        player.play(decoded.getChannelData(0), decoded.sampleRate);
        audioS = decoded.duration;
      }
      offerDownload(chunks, format, decoder);
      $("audio-seconds").textContent = `${audioS.toFixed(2)} s`;
      // Wall time of the whole response per second of audio: below 1, synthesis outruns playback.
      $("rtf").textContent = audioS > 0 ? (elapsedS / audioS).toFixed(3) : "";
      await player.finished();
      if (run.aborted) return;
      mark("played");
      setState("done");
    } catch (err) {
      if (run.aborted) return;
      player.stop();
      mark("error", { message: String(err.message || err) });
      showError(err.message || String(err));
      setState("error");
    } finally {
      if (current === run) {
        current = null;
        $("stop").disabled = true;
      }
    }
  }

  async function loadModel() {
    try {
      const listing = await fetch("/v1/models");
      if (!listing.ok) throw new Error(await serverError(listing));
      const name = (await listing.json()).models[0];
      const meta = await fetch(`/v2/models/${encodeURIComponent(name)}`);
      if (!meta.ok) throw new Error(await serverError(meta));
      const parameters = (await meta.json()).parameters;
      if (!parameters) {
        // The engine is not loaded yet (cold start): ask again shortly.
        $("model").textContent = `${name} (starting…)`;
        setTimeout(loadModel, 1000);
        return;
      }
      pg.model = name;
      pg.sampleRate = parameters.sample_rate;
      const select = $("voice");
      select.replaceChildren();
      for (const v of parameters.voices || []) select.append(new Option(v, v));
      if (!select.options.length) select.append(new Option("(the model's own)", ""));
      $("model").textContent = `${name} · ${pg.sampleRate} Hz`;
      pg.ready = true;
    } catch (err) {
      showError(`could not read the model's metadata: ${err.message || err}`);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("form").addEventListener("submit", (event) => {
      event.preventDefault();
      speak();
    });
    $("stop").addEventListener("click", () => current && current.abort());
    document.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        $("form").requestSubmit();
      }
    });
    loadModel();
  });
})();
