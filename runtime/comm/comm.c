/* comm.c - what every communicator shares (comm.h). */
#include "comm.h"

#include "util.h"

int ptrt_comm_split(const int64_t *shape, int ndim, int dim, int parts, int64_t *outer,
                    int64_t *chunk)
{
    if (dim < 0 || dim >= ndim || parts < 1 || shape[dim] < 0 || shape[dim] % parts)
        return -1;
    int64_t o = 1, ch = shape[dim] / parts;
    for (int i = 0; i < ndim; i++) {
        if (i != dim && !ptc_mul_ok(i < dim ? o : ch, shape[i], i < dim ? &o : &ch))
            return -1;
    }
    *outer = o;
    *chunk = ch;
    return 0;
}
