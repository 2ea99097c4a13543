module tts-predictor/cluster/images

go 1.24.0
