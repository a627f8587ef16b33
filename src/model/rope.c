/* rope: rotary position embedding frequencies, including Llama 3.1's frequency-dependent scaling
 * (HF transformers `_compute_llama3_parameters`) and linear scaling. Applied in forward.c in the
 * rotate-half layout HF checkpoints use: pairs (i, i + head_dim/2). */
#include <math.h>

#include "model_internal.h"

static void llama3_scale(const csd_model_config *cfg, float *inv_freq, int64_t half) {
    double factor = cfg->rope_factor;
    double low = cfg->rope_low_freq_factor, high = cfg->rope_high_freq_factor;
    double old_len = (double)cfg->rope_orig_max_pos;
    double low_wavelen = old_len / low, high_wavelen = old_len / high;
    for (int64_t i = 0; i < half; i++) {
        double f = inv_freq[i];
        double wavelen = 2.0 * M_PI / f;
        if (wavelen < high_wavelen) continue; /* high frequency: unchanged */
        if (wavelen > low_wavelen) {
            inv_freq[i] = (float)(f / factor);
        } else { /* smooth interpolation between the two regimes */
            double smooth = (old_len / wavelen - low) / (high - low);
            inv_freq[i] = (float)((1.0 - smooth) * f / factor + smooth * f);
        }
    }
}

void csd_rope_init_freqs(const csd_model_config *cfg, float *inv_freq) {
    int64_t hd = cfg->head_dim, half = hd / 2;
    for (int64_t i = 0; i < half; i++) {
        /* As torch: 1 / theta ** (arange(0, hd, 2).float() / hd), evaluated in float32. */
        float expo = (float)(2 * i) / (float)hd;
        inv_freq[i] = (float)(1.0 / pow((double)cfg->rope_theta, (double)expo));
    }
    if (cfg->rope_scaling == CSD_ROPE_SCALING_LLAMA3) llama3_scale(cfg, inv_freq, half);
    if (cfg->rope_scaling == CSD_ROPE_SCALING_LINEAR && cfg->rope_factor > 0)
        for (int64_t i = 0; i < half; i++) inv_freq[i] /= cfg->rope_factor;
}
