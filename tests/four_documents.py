"""Four documents of the shape reported in issue 25 (an espresso machine manual, a cloud storage FAQ, a
returns policy and a long employee handbook that shares a few words with every question) and six
questions, each about exactly one of the first three."""

from __future__ import annotations

ESPRESSO = (
    "Barista Pro 3000 espresso machine: user manual. Before first use, rinse the water tank and fill it with "
    "fresh cold water up to the MAX line. Switch the machine on; the heating light blinks while the boiler "
    "heats and stays on when the machine is ready, after about 40 seconds. To brew a single espresso, grind "
    "18 grams of coffee beans finely, dose them into the portafilter, tamp evenly with 15 kg of pressure and "
    "lock the portafilter into the group head. Press the single-cup button; a shot should take 25 to 30 "
    "seconds. If the espresso runs too fast, grind finer; if it drips slowly, grind coarser. To steam milk, "
    "turn the steam knob, purge the wand, then hold the jug at an angle until the milk reaches 65 degrees. "
    "Descaling: every 2 months, or when the descale light is on, dissolve descaling powder in the water tank "
    "and run the descale program, which takes 25 minutes, then rinse twice with clean water. Clean the drip "
    "tray daily and the shower screen weekly with a brush. Error E1 means the water tank is empty; error E2 "
    "means the boiler is overheating: unplug the machine and let it cool for 30 minutes. The warranty of the "
    "machine covers the boiler and the pump for two years.")
STORAGE = (
    "Northwind Cloud Storage: frequently asked questions. How much storage do I get? The free plan includes "
    "15 GB of storage; the Plus plan 2 TB and the Team plan 5 TB per user. How do I share a folder? Right-click "
    "the folder, choose Share, and enter the email addresses of the people you invite; they can view or edit "
    "depending on the permission you pick. Are my files encrypted? Files are encrypted in transit with TLS "
    "and at rest with AES-256. Can I recover deleted files? Deleted files stay in the trash for 30 days on the "
    "free plan and 180 days on paid plans; restore them from the trash folder. What happens when my storage "
    "is full? Syncing pauses and new uploads fail until you delete files or upgrade your plan. Which devices "
    "can sync? The desktop app syncs Windows, macOS and Linux computers; the mobile app uploads photos from "
    "phones automatically. How do I enable two-factor authentication? Open account settings, select "
    "Security and scan the QR code with an authenticator app.")
RETURNS = (
    "Returns policy. You can return most items within 30 days of delivery for a full refund. Items must be "
    "unused, in their original packaging, with the receipt or order number. To start a return, open your "
    "order in your account and choose Return item; print the prepaid shipping label and drop the parcel at "
    "any post office. Refunds are issued to the original payment method within 5 business days after the "
    "returned item arrives at our warehouse. Opened software, gift cards and perishable food cannot be "
    "returned. Damaged or defective items can be exchanged free of charge; report the damage within 48 hours "
    "of delivery with a photo. Return shipping is free for defective items and costs 4.95 otherwise.")
_HANDBOOK_PARAGRAPHS = [
    "Welcome to the company. This employee handbook describes our policies, benefits and expectations.",
    "Working hours are 9 to 5.30 with a one-hour lunch break; flexible hours can be agreed with your manager.",
    "Remote work is allowed up to three days a week; keep your laptop and company files secure at home.",
    "Annual leave is 25 days per year; request leave in the HR system at least two weeks in advance.",
    "Sick leave: notify your manager before 10 am on the first day; a doctor's note is needed after 3 days.",
    "Expenses are reimbursed within 30 days when submitted with receipts through the expenses portal.",
    "The office kitchen has a coffee machine, a water cooler and a fridge; clean up after yourself daily.",
    "Company equipment such as laptops and phones must be returned to IT on your last working day.",
    "Store confidential documents only on approved company storage, never on personal accounts or devices.",
    "Security: lock your screen when you leave your desk and report lost badges to reception at once.",
    "Performance reviews take place twice a year; goals are agreed with your manager in January and July.",
    "Training: every employee has a yearly learning budget for courses, books and conferences.",
    "Travel must be booked through the travel desk; economy class applies to flights under six hours.",
    "Health insurance covers employees and their families from the first day of employment.",
    "The pension plan matches contributions up to 5 percent of salary after the probation period.",
    "Parental leave is 16 weeks at full pay for every parent, to be taken within the first year.",
    "Harassment of any kind is not tolerated; report concerns to HR or through the anonymous hotline.",
    "Dress code is business casual; customer meetings may require more formal clothing.",
    "Social media: do not share confidential information or speak on behalf of the company.",
    "Overtime is compensated with time off in lieu, agreed with your manager in advance.",
    "Notice period is one month during probation and three months afterwards for both parties.",
    "Parking spaces are limited and assigned by facilities; bicycles can be stored in the basement.",
    "Visitors must sign in at reception, wear a visitor badge and be accompanied at all times.",
    "The IT helpdesk is open from 8 am to 6 pm; urgent issues can be reported by phone.",
]
HANDBOOK = " ".join(p for _ in range(4) for p in _HANDBOOK_PARAGRAPHS)  # ~1,850 tokens (the report: 2,943)

DOCUMENTS = {"espresso-manual": ESPRESSO, "storage-faq": STORAGE, "returns-policy": RETURNS,
             "employee-handbook": HANDBOOK}
QUESTIONS = {
    "How long does the descale program of the espresso machine take?": "espresso-manual",
    "What does error E2 mean on the coffee machine?": "espresso-manual",
    "How many days do deleted files stay in the trash?": "storage-faq",
    "How much storage does the free plan include?": "storage-faq",
    "Within how many days can I return an item for a refund?": "returns-policy",
    "Is return shipping free for a defective item?": "returns-policy",
}
